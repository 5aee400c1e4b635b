"""When the ingest agent processes a batch that is not full."""

from typing import Any

import pytest
from tailguard.agents.errors import SettingsError
from tailguard.agents.ingest import partial_batch_due, settle_due
from tailguard.agents.settings import Settings

S = Settings(ingest_within_s=0.5, ingest_idle_s=0.05)


def test_a_partial_batch_waits_while_messages_keep_coming() -> None:
    # Oldest 0.3 s old, newest 10 ms old: more may follow, and the batch may fill.
    assert not partial_batch_due(S, now=10.0, oldest=9.7, newest=9.99)


def test_a_partial_batch_goes_once_the_input_is_caught_up() -> None:
    # Nothing for 60 ms: waiting on would only delay what the batch closes.
    assert partial_batch_due(S, now=10.0, oldest=9.9, newest=9.94)


def test_a_partial_batch_goes_when_its_oldest_message_is_old_enough() -> None:
    # Messages keep trickling in, but the oldest has waited the longest a batch may.
    assert partial_batch_due(S, now=10.0, oldest=9.5, newest=9.999)


def test_the_idle_time_comes_from_the_environment_and_fits_the_batch_time(
    monkeypatch: Any,
) -> None:
    monkeypatch.setenv("TAILGUARD_INGEST_IDLE_S", "0.02")
    assert Settings.from_env().ingest_idle_s == 0.02
    with pytest.raises(SettingsError, match="ingest_idle_s"):
        Settings(ingest_idle_s=0)
    with pytest.raises(SettingsError, match="ingest_idle_s"):
        Settings(ingest_within_s=0.5, ingest_idle_s=1.0)


def test_what_folds_owe_is_put_in_once_the_input_is_caught_up() -> None:
    # Nothing buffered, nothing for 60 ms, batches owed: settle before a close needs it.
    assert settle_due(S, now=10.0, moved=9.94, buffered=False, owed=True)


def test_what_folds_owe_waits_while_input_comes_or_nothing_is_owed() -> None:
    # A message came, or a batch was done with, 10 ms ago: more input may follow.
    assert not settle_due(S, now=10.0, moved=9.99, buffered=False, owed=True)
    # A batch waits, or is in hand: its fold reads the ledger anyway.
    assert not settle_due(S, now=10.0, moved=9.0, buffered=True, owed=True)
    # Everything is put in already.
    assert not settle_due(S, now=10.0, moved=9.0, buffered=False, owed=False)
