"""The delivery log (what was delivered, on disk) and the retry backoff."""

import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tailguard.alerts.delivery import Backoff, DeliveryLog
from tailguard.alerts.errors import AlertsConfigError, DeliveryStateError


@given(
    attempt=st.integers(min_value=0, max_value=10_000),
    base=st.floats(min_value=0.01, max_value=5),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_backoff_grows_with_jitter_and_never_passes_the_bound(
    attempt: int, base: float, seed: int
) -> None:
    backoff = Backoff(base_s=base, max_s=30.0)
    cap = min(30.0, base * 2.0 ** min(attempt, 64))
    delay = backoff.delay(attempt, random.Random(seed))
    assert cap / 2 <= delay <= cap <= 30.0


def test_backoff_doubles_until_the_bound() -> None:
    backoff = Backoff(base_s=1.0, max_s=8.0)
    rng = random.Random(7)
    upper = [max(backoff.delay(n, rng) for _ in range(200)) for n in range(6)]
    lower = [min(backoff.delay(n, rng) for _ in range(200)) for n in range(6)]
    assert upper == pytest.approx([1, 2, 4, 8, 8, 8], rel=0.05)
    assert lower == pytest.approx([0.5, 1, 2, 4, 4, 4], rel=0.05)


@pytest.mark.parametrize(("base", "top", "factor"), [(0, 1, 2), (2, 1, 2), (1, 2, 0.5)])
def test_a_bad_backoff_is_refused(base: float, top: float, factor: float) -> None:
    with pytest.raises(AlertsConfigError):
        Backoff(base_s=base, max_s=top, factor=factor)


def test_a_recorded_delivery_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "log.json"
    log = DeliveryLog.load(path)
    assert not log.delivered("t", 0, "e1")
    log.record("t", 0, 41, "e1")
    log.record("t", 1, 7, "e2")
    again = DeliveryLog.load(path)
    assert again.delivered("t", 0, "e1")
    assert again.delivered("t", 1, "e2")
    assert not again.delivered("t", 1, "e1")  # per partition
    assert not again.delivered("u", 0, "e1")  # per topic
    assert again.last_offset("t", 0) == 41
    assert [p.name for p in path.parent.iterdir()] == ["log.json"]  # no temporary left


def test_the_log_keeps_only_the_newest_ids(tmp_path: Path) -> None:
    path = tmp_path / "log.json"
    log = DeliveryLog.load(path, keep=3)
    for i in range(5):
        log.record("t", 0, i, f"e{i}")
    again = DeliveryLog.load(path, keep=3)
    assert [again.delivered("t", 0, f"e{i}") for i in range(5)] == [False, False, True, True, True]
    assert json.loads(path.read_text())["partitions"]["t"]["0"]["event_ids"] == ["e2", "e3", "e4"]


@pytest.mark.parametrize(
    "text", ["{", '{"version": 9, "partitions": {}}', '{"version": 1, "partitions": {"t": 3}}']
)
def test_a_broken_log_says_what_to_do(tmp_path: Path, text: str) -> None:
    path = tmp_path / "log.json"
    path.write_text(text)
    with pytest.raises(DeliveryStateError, match="move it away"):
        DeliveryLog.load(path)


def test_an_unreadable_or_unwritable_log_fails_loudly(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(DeliveryStateError, match="cannot read"):
        DeliveryLog.load(blocker / "log.json")
    folder = tmp_path / "gone"
    log = DeliveryLog.load(folder / "log.json")
    folder.write_text("")  # the folder is now a file: nothing can be written under it
    with pytest.raises(DeliveryStateError, match="cannot write"):
        log.record("t", 0, 1, "e1")
