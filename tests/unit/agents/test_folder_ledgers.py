"""What folds owe the buckets is held per home partition, so a checkpoint of one
partition puts in only what that partition's folds owe."""

import pytest
from tailguard.agents import folder as folder_module
from tailguard.streams import SeriesWindows
from tailguard.streams.fold_batch import Ledger

from tests.unit.agents.test_folder_points import folder
from tests.unit.streams.conftest import T0_MS as T0
from tests.unit.streams.conftest import Event as Ev


def folded(f: folder_module.SeriesFolder, partition: int, events: int, tag: str) -> SeriesWindows:
    """A series homed on ``partition`` that folded ``events`` requests through the
    folder's ledger of that partition (as :meth:`SeriesFolder.fold` does)."""
    state = SeriesWindows()
    state.ledger = f.ledgers.setdefault(partition, Ledger())
    state.add([Ev(f"{tag}{i}", T0 + i * 100, ttft_ms=100.0 + i) for i in range(events)])
    return state


def test_reading_a_series_of_one_partition_leaves_the_others_owed() -> None:
    f = folder()
    a, b = folded(f, 0, 30, "a"), folded(f, 1, 20, "b")
    assert f.owes() and f.ledgers[0].events == 30 and f.ledgers[1].events == 20
    a.take_changes()  # what a checkpoint of partition 0 reads
    assert f.ledgers[0].events == 0 and f.ledgers[1].events == 20
    assert a.window(60_000, T0 + 60_000).counters.requests == 30
    f.settle()
    assert not f.owes()
    assert b.window(60_000, T0 + 60_000).counters.requests == 20


def test_the_ledgers_together_hold_no_more_than_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(folder_module, "MAX_HELD_EVENTS", 40)
    f = folder()
    for partition, events, tag in ((0, 30, "a"), (1, 20, "b"), (2, 5, "c")):
        folded(f, partition, events, tag)
    f._bound_ledgers()
    held = {p: ledger.events for p, ledger in f.ledgers.items()}
    assert held == {0: 0, 1: 20, 2: 5}, "the largest put in, until under the bound"


def test_a_revoked_partition_puts_in_what_it_owes_and_drops_its_ledger() -> None:
    f = folder()
    kept = folded(f, 0, 10, "a")
    gone = folded(f, 1, 12, "b")
    owed = f.ledgers[1]
    f.revoked({1})
    assert 1 not in f.ledgers and not owed and f.ledgers[0].events == 10
    assert gone.window(60_000, T0 + 60_000).counters.requests == 12
    assert kept.window(60_000, T0 + 60_000).counters.requests == 10
