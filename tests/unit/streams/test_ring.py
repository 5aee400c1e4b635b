"""Event-time semantics of ``SeriesWindows``: lateness, dedup, closing, windows, roll-up, pruning.

Default ring: 1 min buckets, 2 min allowed lateness, 1 h roll-ups, minute
buckets kept 2 h, hour buckets kept 3 d + 1 h. ``t0`` is hour-aligned, so the
minute bucket ``[t0 + i min, t0 + (i+1) min)`` closes once the watermark reaches
``t0 + (i + 3) min``.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from tailguard.streams import WINDOWS, CorruptStateError, RingConfig, SeriesWindows, summarize
from tailguard.streams.bucket import Bucket
from tailguard.streams.replay import add_replay

SECOND_MS = 1_000
MINUTE_MS = 60_000
HOUR_MS = 3_600_000

MakeEvent = Callable[..., Any]
MakeWindows = Callable[..., SeriesWindows]


def minute(t0: int, i: int, seconds: int = 0) -> int:
    return t0 + i * MINUTE_MS + seconds * SECOND_MS


# ------------------------------------------------------------------ lateness


def test_out_of_order_event_within_lateness_is_merged(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    windows.add([make_event(minute(t0, 3))])
    result = windows.add([make_event(minute(t0, 1, 30))])
    assert (result.accepted, result.late) == (1, 0)
    windows.settle()
    assert windows.fine[minute(t0, 1)].counters.requests == 1
    assert windows.counters(WINDOWS["5m"]).requests == 2
    assert windows.watermark_ms == minute(t0, 3)


def test_late_event_is_counted_not_merged(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    windows.add([make_event(minute(t0, 5))])
    result = windows.add([make_event(minute(t0, 1, 10))])
    assert (result.accepted, result.late) == (0, 1)
    assert windows.late == 1
    assert minute(t0, 1) not in windows.fine
    assert windows.counters(WINDOWS["1h"]).requests == 1


@pytest.mark.parametrize(
    ("watermark_offset_ms", "late"),
    [(-1, 0), (0, 1)],
    ids=["one-ms-before-close-is-on-time", "at-close-is-late"],
)
def test_a_bucket_closes_exactly_when_the_watermark_reaches_its_end_plus_lateness(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows, watermark_offset_ms: int, late: int
) -> None:
    windows = make_windows()
    closes_at = minute(t0, 2) + 120_000  # end of [t0+1m, t0+2m) + lateness
    windows.add([make_event(closes_at + watermark_offset_ms)])
    result = windows.add([make_event(minute(t0, 1, 59))])
    assert result.late == late
    assert result.accepted == 1 - late


def test_an_event_is_judged_against_the_watermark_of_the_events_before_it_in_its_batch(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    batch = [make_event(minute(t0, 1)), make_event(minute(t0, 9)), make_event(minute(t0, 1))]
    result = windows.add(batch)
    assert (result.accepted, result.late) == (2, 1)
    assert windows.fine[minute(t0, 1)].counters.requests == 1


def test_a_late_event_does_not_move_the_watermark(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    windows.add([make_event(minute(t0, 9))])
    windows.add([make_event(minute(t0, 1))])
    assert windows.watermark_ms == minute(t0, 9)


# ------------------------------------------------------------------ duplicates


@pytest.mark.parametrize("same_batch", [True, False], ids=["same-batch", "next-batch"])
def test_duplicate_event_id_in_an_open_bucket_is_counted_once_and_as_a_duplicate(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows, same_batch: bool
) -> None:
    windows = make_windows()
    first = make_event(minute(t0, 1, 5), event_id="req-42")
    again = make_event(minute(t0, 1, 5), event_id="req-42")
    if same_batch:
        results = [windows.add([first, again])]
    else:
        results = [windows.add([first]), windows.add([again])]
    assert sum(r.accepted for r in results) == 1
    assert sum(r.duplicates for r in results) == 1
    assert windows.duplicates == 1
    assert windows.counters(WINDOWS["5m"]).requests == 1
    assert windows.window(WINDOWS["5m"]).digests["ttft_ms"].n_values == 1


def test_a_duplicate_of_an_event_whose_bucket_closed_is_late_not_counted_twice(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    windows.add([make_event(minute(t0, 1), event_id="req-7")])
    windows.add([make_event(minute(t0, 10))])
    result = windows.add([make_event(minute(t0, 1), event_id="req-7")])
    assert (result.accepted, result.duplicates, result.late) == (0, 0, 1)
    assert windows.counters(WINDOWS["1h"]).requests == 2


def test_distinct_event_ids_with_the_same_timestamp_are_not_duplicates(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    result = windows.add([make_event(minute(t0, 1)) for _ in range(5)])
    assert (result.accepted, result.duplicates) == (5, 0)


# ------------------------------------------------------------------ closing


def test_closed_ends_reports_each_minute_bucket_once_as_it_closes(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    first = windows.add([make_event(minute(t0, i, 10)) for i in range(3)])
    assert first.closed_ends == []
    # Watermark t0+5m: [t0, t0+1m), [t0+1m, t0+2m) and [t0+2m, t0+3m) have closed.
    second = windows.add([make_event(minute(t0, 5))])
    assert second.closed_ends == [minute(t0, 1), minute(t0, 2), minute(t0, 3)]
    assert all(windows.fine[minute(t0, i)].ids is None for i in range(3))
    assert windows.fine[minute(t0, 5)].ids is not None
    assert windows.add([make_event(minute(t0, 5, 30))]).closed_ends == []
    assert windows.add([make_event(minute(t0, 8))]).closed_ends == [minute(t0, 6)]


def test_closed_ends_are_oldest_first_when_one_batch_closes_many(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    assert windows.add([make_event(minute(t0, i)) for i in (2, 0, 1)]).closed_ends == []
    result = windows.add([make_event(minute(t0, 30))])
    assert result.closed_ends == [minute(t0, 1), minute(t0, 2), minute(t0, 3)]


# ------------------------------------------------------------------ windows


@pytest.fixture
def ninety_minutes(t0: int, make_event: MakeEvent, make_windows: MakeWindows) -> SeriesWindows:
    """Minute ``i`` of t0 … t0+89 holds ``i % 7 + 1`` requests, fed one minute per batch."""
    windows = make_windows()
    for i in range(90):
        windows.add([make_event(minute(t0, i, 30)) for _ in range(i % 7 + 1)])
    return windows


def expected(first: int, last: int) -> int:
    """Requests in minutes ``first … last`` of the ``ninety_minutes`` fixture."""
    return sum(i % 7 + 1 for i in range(first, last + 1))


@pytest.mark.parametrize(
    ("window", "first_minute"),
    [("1m", 89), ("5m", 85), ("30m", 60), ("1h", 30)],
)
def test_windows_ending_at_the_watermark_hold_exactly_their_minutes(
    ninety_minutes: SeriesWindows, window: str, first_minute: int
) -> None:
    want = expected(first_minute, 89)
    assert ninety_minutes.counters(WINDOWS[window]).requests == want
    merged = ninety_minutes.window(WINDOWS[window])
    assert merged.counters.requests == want
    assert merged.digests["ttft_ms"].n_values == want


@pytest.mark.parametrize(
    ("window", "end_minute"),
    [("1m", 60), ("5m", 47), ("1h", 60), ("1h", 61), ("1h", 75)],
)
def test_windows_with_an_explicit_end_hold_exactly_their_minutes(
    ninety_minutes: SeriesWindows, t0: int, window: str, end_minute: int
) -> None:
    first_minute = end_minute - WINDOWS[window] // MINUTE_MS
    want = expected(max(first_minute, 0), end_minute - 1)
    end = minute(t0, end_minute)
    assert ninety_minutes.counters(WINDOWS[window], end_ms=end).requests == want
    assert ninety_minutes.window(WINDOWS[window], end_ms=end).counters.requests == want


def test_the_first_hour_is_rolled_up_while_its_minutes_are_still_kept(
    ninety_minutes: SeriesWindows, t0: int
) -> None:
    assert list(ninety_minutes.coarse) == [t0]
    assert ninety_minutes.coarse[t0].counters.requests == expected(0, 59)
    assert ninety_minutes.coarse[t0].ids is None
    assert min(ninety_minutes.fine) == t0


def test_an_empty_ring_has_empty_windows(make_windows: MakeWindows) -> None:
    windows = make_windows()
    assert windows.default_end() is None
    assert windows.counters(WINDOWS["1h"]).requests == 0
    assert windows.window(WINDOWS["1h"]).digests == {}


# ------------------------------------------------------------------ windows longer than an hour


@pytest.fixture
def five_hours(t0: int, make_event: MakeEvent, make_windows: MakeWindows) -> SeriesWindows:
    """One request per minute over t0 … t0+5h, fed 10 minutes per batch."""
    windows = make_windows()
    for batch in range(30):
        windows.add([make_event(minute(t0, 10 * batch + i, 20)) for i in range(10)])
    return windows


def test_hours_are_rolled_up_once_closed(five_hours: SeriesWindows, t0: int) -> None:
    # Watermark t0 + 4 h 59 min 20 s: hour t0+3h closed at t0+4h+2min, hour t0+4h is open.
    assert sorted(five_hours.coarse) == [t0 + k * HOUR_MS for k in range(4)]
    assert all(b.counters.requests == 60 for b in five_hours.coarse.values())


@pytest.mark.parametrize("window", ["6h", "1d", "3d"])
def test_windows_longer_than_an_hour_count_rolled_up_hours_once(
    five_hours: SeriesWindows, window: str
) -> None:
    # Hour t0+3h is stored twice (roll-up and its minutes): it must count once.
    assert five_hours.counters(WINDOWS[window]).requests == 300
    assert five_hours.window(WINDOWS[window]).digests["ttft_ms"].n_values == 300


@pytest.mark.parametrize(
    ("window_ms", "end_ms_from_t0", "want"),
    [
        (2 * HOUR_MS, 4 * HOUR_MS, 120),  # hours 2 and 3, both as roll-ups
        (90 * MINUTE_MS, 4 * HOUR_MS + 30 * MINUTE_MS, 90),  # roll-up 3 + 30 minutes of hour 4
        (WINDOWS["6h"], 7 * HOUR_MS + 30 * MINUTE_MS, 180),  # old edge: half of hour 1 is gone
    ],
    ids=["two-rolled-up-hours", "roll-up-plus-minutes", "partial-old-hour-dropped"],
)
def test_long_windows_merge_whole_hours_and_minutes_without_double_counting(
    five_hours: SeriesWindows, t0: int, window_ms: int, end_ms_from_t0: int, want: int
) -> None:
    assert five_hours.counters(window_ms, end_ms=t0 + end_ms_from_t0).requests == want


# ------------------------------------------------------------------ pruning


def test_minute_buckets_are_pruned_after_fine_retention_and_reported_as_deletes(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    windows.add([make_event(t0 + 10 * SECOND_MS)])
    windows.take_changes()
    windows.add([make_event(t0 + 2 * HOUR_MS)])  # t0 is not older than wm - 2 h yet
    changes = windows.take_changes()
    assert t0 in windows.fine
    assert ("h", t0) in changes.upserts  # rolled up meanwhile
    assert ("m", t0) not in changes.deletes
    windows.add([make_event(t0 + 2 * HOUR_MS + 1)])
    changes = windows.take_changes()
    assert t0 not in windows.fine
    assert changes.deletes == [("m", t0)]
    assert ("m", t0) not in changes.upserts
    assert windows.coarse[t0].counters.requests == 1


def test_hour_buckets_are_pruned_after_retention_and_reported_as_deletes(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    retention = RingConfig().retention_ms
    windows.add([make_event(t0 + 10 * SECOND_MS)])
    windows.add([make_event(t0 + 3 * HOUR_MS)])
    windows.take_changes()
    windows.add([make_event(t0 + retention)])
    assert t0 in windows.coarse
    assert ("h", t0) not in windows.take_changes().deletes
    windows.add([make_event(t0 + retention + 1)])
    changes = windows.take_changes()
    assert t0 not in windows.coarse
    assert ("h", t0) in changes.deletes
    # Left: the roll-up of hour t0+3h and the minute holding t0+retention(+1 ms).
    assert windows.counters(WINDOWS["3d"]).requests == 3


def test_take_changes_reports_only_what_changed_since_the_last_call(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    windows.add([make_event(minute(t0, 1)), make_event(minute(t0, 2))])
    assert set(windows.take_changes().upserts) == {("m", minute(t0, 1)), ("m", minute(t0, 2))}
    idle = windows.take_changes()
    assert (idle.upserts, idle.deletes) == ({}, [])
    windows.add([make_event(minute(t0, 2, 30))])
    # Stored before and still open: a segment of what it gained (version 2).
    assert set(windows.take_changes().upserts) == {("m", minute(t0, 2), 2)}


# ------------------------------------------------------------------ replay by input position


def test_replaying_an_input_message_already_in_its_bucket_counts_nothing_twice(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    events = [make_event(minute(t0, 1, s)) for s in range(3)]
    first = windows.add(events, positions=[(0, 17)] * 3)
    again = windows.add(events, positions=[(0, 17)] * 3)
    assert first.accepted == 3
    assert (again.accepted, again.replayed, again.duplicates) == (0, 3, 0)
    assert windows.counters(WINDOWS["5m"]).requests == 3


def test_a_later_input_position_is_not_mistaken_for_a_replay(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    windows.add([make_event(minute(t0, 1))], positions=[(0, 17)])
    batch = [make_event(minute(t0, 1)), make_event(minute(t0, 1))]
    result = windows.add(batch, positions=[(0, 18), (1, 3)])
    assert (result.accepted, result.replayed) == (2, 0)


# ------------------------------------------------------------------ stored state


@pytest.fixture
def stored(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> tuple[bytes, dict[Any, bytes]]:
    """Meta bytes and bucket records of a ring with one minute and one hour bucket."""
    windows = make_windows()
    windows.add([make_event(t0 + 5 * SECOND_MS), make_event(t0 + 2 * HOUR_MS)])
    changes = windows.take_changes()
    return changes.meta, dict(changes.upserts)


@pytest.mark.parametrize(
    "meta",
    [b"", b"\xff", b"\x93\x01\x02\x03", b"\x81\xa1a\x01"],
    ids=["empty", "bad-msgpack", "short-array", "map"],
)
def test_corrupt_meta_bytes_raise_corrupt_state_error(meta: bytes) -> None:
    with pytest.raises(CorruptStateError, match="meta"):
        SeriesWindows.restore(meta, lambda key: None)


def test_every_truncation_of_the_meta_raises_corrupt_state_error(
    stored: tuple[bytes, dict[Any, bytes]],
) -> None:
    meta, buckets = stored
    for cut in range(len(meta)):
        with pytest.raises(CorruptStateError):
            SeriesWindows.restore(meta[:cut], buckets.get)


def test_a_corrupt_bucket_record_raises_corrupt_state_error_naming_its_key(
    stored: tuple[bytes, dict[Any, bytes]], t0: int
) -> None:
    meta, buckets = stored
    buckets[("h", t0)] = buckets[("h", t0)][:-3]
    with pytest.raises(CorruptStateError, match=rf"\('h', {t0}\)"):
        SeriesWindows.restore(meta, buckets.get)


def test_a_minute_bucket_missing_from_the_store_restores_empty(
    stored: tuple[bytes, dict[Any, bytes]], t0: int
) -> None:
    meta, buckets = stored
    minute_of_last_event = t0 + 2 * HOUR_MS
    del buckets[("m", minute_of_last_event)]
    restored = SeriesWindows.restore(meta, buckets.get)
    assert restored.fine[minute_of_last_event].counters.requests == 0
    assert restored.coarse[t0].counters.requests == 1


def test_replayed_input_whose_bucket_has_closed_is_counted_as_replayed_not_late(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    first = make_event(t0 + 10 * SECOND_MS)
    windows.add([first], positions=[(0, 1)])
    windows.add([make_event(minute(t0, 10))], positions=[(0, 2)])
    again = windows.add([first], positions=[(0, 1)])
    assert (again.replayed, again.late) == (1, 0)
    assert windows.late == 0


def test_a_lost_bucket_record_is_refilled_by_replay_after_its_bucket_closed(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    # One input batch: its first event's bucket closes within the same call.
    batch = [make_event(t0 + 10 * SECOND_MS), make_event(minute(t0, 10))]
    positions = [(0, 1), (0, 2)]
    original = make_windows()
    original.add(batch, positions=positions)
    changes = original.take_changes()
    store = dict(changes.upserts)
    del store[("m", t0)]  # the crash lost this record; the meta's reached the changelog
    restored = SeriesWindows.restore(changes.meta, store.get)
    restored.add(batch, positions=positions)
    assert restored.counters(WINDOWS["1h"]) == original.counters(WINDOWS["1h"])
    assert restored.late == original.late == 0


Positions = list[tuple[int, int]]


def _open_minute_lost(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> tuple[list[Any], Positions, SeriesWindows, Any, SeriesWindows]:
    """Two minutes folded, then restored without the open minute's record:
    the batch, its positions, the original ring, its changes and the restored ring."""
    batch = [make_event(minute(t0, 1)), make_event(minute(t0, 2))]
    positions = [(0, 1), (0, 2)]
    original = make_windows()
    original.add(batch, positions=positions)
    changes = original.take_changes()
    store = dict(changes.upserts)
    del store[("m", minute(t0, 1))]
    restored = SeriesWindows.restore(changes.meta, store.get)
    return batch, positions, original, changes, restored


def test_a_lost_bucket_record_of_an_open_bucket_is_refilled_by_replay(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    batch, positions, original, _, restored = _open_minute_lost(t0, make_event, make_windows)
    result = restored.add(batch, positions=positions)
    assert (result.accepted, result.replayed) == (1, 1)
    assert restored.counters(WINDOWS["1h"]) == original.counters(WINDOWS["1h"])


def test_only_a_restore_that_lost_a_bucket_record_awaits_a_refill_until_the_replay(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    batch, positions, original, changes, restored = _open_minute_lost(t0, make_event, make_windows)
    assert not original.awaiting_refill()
    whole = SeriesWindows.restore(changes.meta, changes.upserts.get)
    assert not whole.awaiting_refill()
    assert restored.awaiting_refill()
    restored.add(batch, positions=positions)  # the replay refills it ...
    assert restored.awaiting_refill()
    restored.add([make_event(minute(t0, 3))], positions=[(0, 3)])  # ... until new input
    assert not restored.awaiting_refill()
    assert not any(b.refill for b in restored.fine.values())


def _write(store: dict[Any, bytes], changes: Any, lose: frozenset[Any] = frozenset()) -> bytes:
    """Apply ``changes`` to ``store`` except the upserts in ``lose``; return the meta."""
    store.update({k: v for k, v in changes.upserts.items() if k not in lose})
    for key in changes.deletes:
        store.pop(key, None)
    meta: bytes = changes.meta
    return meta


def test_a_lost_hour_record_is_rebuilt_after_restore(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    original, store = make_windows(), dict[Any, bytes]()
    original.add([make_event(minute(t0, 1))], positions=[(0, 1)])
    _write(store, original.take_changes())
    rolls_up_hour_t0 = [make_event(t0 + HOUR_MS + 5 * MINUTE_MS)]
    original.add(rolls_up_hour_t0, positions=[(0, 2)])
    meta = _write(store, original.take_changes(), lose=frozenset({("h", t0)}))

    restored = SeriesWindows.restore(meta, store.get)
    restored.add(rolls_up_hour_t0, positions=[(0, 2)])  # the replay after the crash
    prunes_minutes_of_hour_t0 = [make_event(t0 + 4 * HOUR_MS)]
    for windows in (original, restored):
        windows.add(prunes_minutes_of_hour_t0, positions=[(0, 3)])
    assert restored.counters(WINDOWS["6h"]) == original.counters(WINDOWS["6h"])


def test_replaying_a_message_after_restore_does_not_count_its_late_events_twice(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    original, store = make_windows(), dict[Any, bytes]()
    original.add([make_event(minute(t0, 10))], positions=[(0, 1)])
    _write(store, original.take_changes())
    message = [make_event(minute(t0, 1)), make_event(minute(t0, 10, 1))]
    assert original.add(message, positions=[(0, 2)] * 2).late == 1
    meta = _write(store, original.take_changes())

    restored = SeriesWindows.restore(meta, store.get)
    restored.add(message, positions=[(0, 2)] * 2)
    assert restored.late == original.late == 1


def test_a_window_read_before_a_replay_refills_a_closed_bucket_sees_the_refill(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    """Replay may legitimately add to a closed bucket whose record was stale;
    the merged-window cache must not keep serving the old sum."""
    first = [make_event(t0 + 1_000 * i, event_id=f"a{i}") for i in range(3)]
    second = [make_event(t0 + 1_000 * i + 500, event_id=f"b{i}") for i in range(3)]
    closer = [make_event(minute(t0, 10), event_id="late-closer")]
    original = make_windows()
    original.add(first, positions=[(0, 1)] * 3)
    stale = original.take_changes()
    original.add(second, positions=[(0, 2)] * 3)
    original.add(closer, positions=[(0, 3)])
    changes = original.take_changes()
    store = dict(stale.upserts)  # the minute-0 record of offset 2 never reached the store
    store.update({k: v for k, v in changes.upserts.items() if k != ("m", t0)})
    restored = SeriesWindows.restore(changes.meta, store.get)
    assert restored.window(WINDOWS["1h"], minute(t0, 11)).counters.requests == 4
    restored.add(second, positions=[(0, 2)] * 3)
    assert restored.window(WINDOWS["1h"], minute(t0, 11)).counters.requests == 7


_SMALL = RingConfig(
    bucket_ms=1_000,
    rollup_ms=10_000,
    fine_retention_ms=20_000,
    retention_ms=60_000,
    allowed_lateness_ms=2_000,
)
_T0 = 1_700_000_000_000


def test_a_duplicate_moves_the_watermark_so_its_replay_can_too(make_event: Any) -> None:
    """The same event id again, later in the same minute: not counted, but the
    watermark moves, also when the replay after a crash finds it already folded
    in (found by review: the replay moved it, the first pass did not)."""
    first = make_event(_T0, event_id="x")
    again = make_event(_T0 + 900, event_id="x")
    original = SeriesWindows(_SMALL)
    original.add([first], positions=[(0, 0)])
    meta_before = original.take_changes().meta
    result = original.add([again], positions=[(0, 1)])
    assert (result.accepted, result.duplicates) == (0, 1)
    assert original.watermark_ms == _T0 + 900
    # Stored whole (a segment ahead of its meta is never read): restored with the
    # meta from before and the bucket from after, which is ahead.
    original.rewrite_all()
    changes = original.take_changes()
    assert set(changes.upserts) == {("m", _T0)}
    restored = SeriesWindows.restore(meta_before, changes.upserts.get, _SMALL)
    replay = restored.add([again], positions=[(0, 1)])
    assert replay.replayed == 1
    assert restored.watermark_ms == original.watermark_ms


def test_both_paths_judge_lateness_alike_after_a_duplicate(make_event: Any) -> None:
    """A lateness that is not a whole number of buckets, a duplicate with a later
    time, then an older request: the vectorised and the request-by-request path
    must agree on what is late (found by review)."""
    odd = dataclasses.replace(_SMALL, allowed_lateness_ms=1_500)
    from tailguard.streams.columns import Columns

    x1, x2 = make_event(_T0, event_id="x"), make_event(_T0 + 999, event_id="x")
    for older in range(_T0 - 4_000, _T0, 250):
        batch = [x1, x2, make_event(older, event_id="y")]
        cols = Columns.from_events(batch, [(0, 0)] * 3)
        fast, slow = SeriesWindows(odd), SeriesWindows(odd)
        a = fast.add_columns(cols)
        b = add_replay(slow, cols, None)
        assert (a.accepted, a.late, a.duplicates) == (b.accepted, b.late, b.duplicates), older
        assert fast.watermark_ms == slow.watermark_ms


@pytest.mark.parametrize(("window", "end_minute"), [("1m", 60), ("5m", 47), ("1h", 61)])
def test_readers_of_a_closed_window_share_one_merged_bucket_and_leave_it_as_it_was(
    ninety_minutes: SeriesWindows, t0: int, window: str, end_minute: int
) -> None:
    # window() hands every reader of a closed end the same merged bucket (a minute's
    # close reads some windows three times); a window of one closed bucket is that
    # bucket itself. The readers must only read: after the snapshot summary (with
    # digests) it is byte for byte a fresh merge of its parts (or the part), and
    # the ring's own buckets are as they were.
    ring = ninety_minutes
    ms, end = WINDOWS[window], minute(t0, end_minute)
    ring_before = {start: b.to_bytes() for start, b in ring.fine.items()}
    first = ring.window(ms, end)
    summarize(first, ms, ring.thresholds, with_digests=True)
    again = ring.window(ms, end)
    assert again is first
    hours, minutes = ring._tiers(ms, end)
    parts = hours + minutes
    if len(parts) == 1 and all(s.exact for s in parts[0].digests.values()):
        assert again is parts[0]
        fresh = Bucket.from_bytes(ring_before[parts[0].start_ms])
    else:
        fresh = Bucket.combine(parts, ring.config.max_centroids)
    assert again.to_bytes() == fresh.to_bytes()
    assert {start: b.to_bytes() for start, b in ring.fine.items()} == ring_before
    ring.release_window_cache()
    if again is not parts[0]:
        assert ring.window(ms, end) is not first


def test_a_restored_ring_reads_windows_byte_for_byte_as_the_live_one(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    # Minutes created out of time order (a later minute's request arrives first,
    # an earlier one's within the allowed lateness): the live ring holds them in
    # that order, a restored one in time order. A window merges its buckets in
    # time order either way, so its digests and exemplars are the same bytes.
    live = make_windows()
    for m in (3, 1, 2, 0, 5, 4):
        live.add(
            [make_event(minute(t0, m) + s * SECOND_MS, e2e_ms=100.0 + m + s) for s in range(9)]
        )
    changes = live.take_changes()
    restored = SeriesWindows.restore(changes.meta, changes.upserts.get)
    assert list(live.fine) != sorted(live.fine)
    for window in ("5m", "30m"):
        end = minute(t0, 6)
        assert (
            live.window(WINDOWS[window], end).to_bytes()
            == restored.window(WINDOWS[window], end).to_bytes()
        )


def test_a_minute_read_alone_is_exact_even_when_stored_as_a_digest(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    # 60 requests × 20 gaps = 1,200 ITL values: more than a stored bucket keeps
    # exact, fewer than a read keeps exact. The 1-minute window of that one
    # closed minute must still give numpy's own percentiles.
    ring = make_windows()
    gaps = [[10.0 + (i * 7 + j * 13) % 97 for j in range(20)] for i in range(60)]
    ring.add([make_event(t0 + i * SECOND_MS, itl_ms=gaps[i]) for i in range(60)])
    ring.add([make_event(minute(t0, 5))])  # closes minute 0
    bucket = ring.fine[t0]
    assert bucket.ids is None and not bucket.digests["itl_ms"].exact
    window = ring.window(WINDOWS["1m"], minute(t0, 1))
    values = np.array([g for row in gaps for g in row])
    got = summarize(window, WINDOWS["1m"], ring.thresholds).latency["itl_ms"]
    for name, q in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999)):
        assert got[name] == pytest.approx(float(np.quantile(values, q)), rel=1e-12)


def test_a_closed_minute_read_alone_is_its_own_window_with_the_reads_of_a_merge(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    # 40 requests of 30 gaps: 1,200 ITL values, past the exact limit (a digest with a tail).
    events = [
        make_event(minute(t0, 0, s), itl_ms=[30.0 + (s * 7 + k) % 11 for k in range(30)])
        for s in range(40)
    ]
    windows.add(events)
    windows.settle()
    itl = windows.fine[t0].digests["itl_ms"]
    assert not itl.exact and not itl.settled
    merged_open = windows.window(WINDOWS["1m"], minute(t0, 1))  # merged while open
    expected = merged_open.digests["itl_ms"].quantiles([0.5, 0.95, 0.99])
    windows.add([make_event(minute(t0, 5))])  # closes the minute
    closed = windows.fine[t0]
    assert closed.ids is None and all(s.settled for s in closed.digests.values())
    for name in ("1m", "5m"):
        read = windows.window(WINDOWS[name], minute(t0, 1))
        assert read is closed
        assert read.digests["itl_ms"].quantiles([0.5, 0.95, 0.99]) == expected


def test_windows_holding_the_same_buckets_share_one_merge_that_reads_as_each_window(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    for m in range(3):  # three minutes, the last one still open
        windows.add([make_event(minute(t0, m, s), e2e_ms=100.0 + 10 * m + s) for s in range(20)])
    end = minute(t0, 3)
    names = ("1m", "5m", "1h")
    shared = windows.windows([WINDOWS[n] for n in names], end)
    # 5m and 1h hold the same three minutes; 1m holds the open one alone.
    assert shared[1] is shared[2]
    assert shared[0] is not shared[1]
    for name, got in zip(names, shared, strict=True):
        alone = windows.window(WINDOWS[name], end)
        assert got.to_bytes() == alone.to_bytes()
        assert summarize(got, WINDOWS[name], windows.thresholds) == summarize(
            alone, WINDOWS[name], windows.thresholds
        )
