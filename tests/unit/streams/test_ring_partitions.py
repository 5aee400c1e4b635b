"""One series fed by several input partitions: each partition has its own
watermark, the series meets the lowest, and lateness does not depend on how
the partitions' messages interleave (a replay interleaves them differently)."""

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.streams import AddResult, SeriesWindows
from tailguard.streams import fold as fold_module
from tailguard.streams.columns import Columns
from tailguard.streams.replay import add_replay

from tests.unit.streams.test_ring_properties import (
    SMALL,
    T0,
    WINDOW_LENGTHS,
    MakeEvent,
    fingerprint,
    in_messages,
    moves,
    stream,
    totals,
)

Message = tuple[int, int, list[Any]]  # (partition, offset, requests)


def partition_messages(plans: list[Any], make_event: MakeEvent, size: int) -> list[list[Message]]:
    """Per partition: a first message of one request at the same early time (so
    every partition feeds the series before anything closes), then its plan."""
    out = []
    for k, plan in enumerate(plans):

        def make(ts: int, k: int = k, **fields: Any) -> Any:
            return make_event(ts, **{**fields, "event_id": f"p{k}-{fields['event_id']}"})

        first = [make(T0 - 10_000, event_id="first")]
        messages = [first, *in_messages(stream(plan, make), size)]
        out.append([(k, offset, requests) for offset, requests in enumerate(messages)])
    return out


def one_after_another(per_partition: list[list[Message]]) -> list[Message]:
    firsts = [messages[0] for messages in per_partition]
    return firsts + [m for messages in per_partition for m in messages[1:]]


def in_turn(per_partition: list[list[Message]]) -> list[Message]:
    longest = max(len(messages) for messages in per_partition)
    return [m[i] for i in range(longest) for m in per_partition if i < len(m)]


def columns(messages: list[Message]) -> Columns:
    return Columns.from_events(
        [r for _, _, requests in messages for r in requests],
        [(p, o) for p, o, requests in messages for _ in requests],
    )


def fold(messages: list[Message], per_call: int) -> tuple[SeriesWindows, list[AddResult]]:
    windows = SeriesWindows(SMALL)
    results = [
        windows.add_columns(columns(messages[i : i + per_call]))
        for i in range(0, len(messages), per_call)
    ]
    return windows, results


plans = st.lists(moves, min_size=2, max_size=3)


def both_paths(messages: list[Message], per_call: int) -> tuple[SeriesWindows, SeriesWindows]:
    """``messages`` folded ``per_call`` at a time by the batched path and by the
    request-by-request path; asserts they counted and closed alike."""
    fast, slow = SeriesWindows(SMALL), SeriesWindows(SMALL)
    fast_closes: list[int] = []
    slow_closes: list[int] = []
    fast_results, slow_results = [], []
    for i in range(0, len(messages), per_call):
        cols = columns(messages[i : i + per_call])
        fast_results.append(fast.add_columns(cols, fast_closes.append))
        slow_results.append(add_replay(slow, cols, slow_closes.append))
    assert totals(fast_results) == totals(slow_results)
    assert fast_closes == slow_closes
    return fast, slow


@settings(max_examples=120, deadline=None)
@given(plans=plans, size=st.integers(min_value=1, max_value=6), per_call=st.integers(1, 5))
def test_how_the_partitions_interleave_does_not_change_what_is_late_or_counted(
    make_event: MakeEvent, plans: list[Any], size: int, per_call: int
) -> None:
    per_partition = partition_messages(plans, make_event, size)
    apart, apart_results = fold(one_after_another(per_partition), per_call)
    mixed, mixed_results = fold(in_turn(per_partition), per_call)
    a, b = totals(apart_results), totals(mixed_results)
    assert a[:3] == b[:3]
    assert sorted(a[3]) == sorted(b[3])
    assert fingerprint(apart) == fingerprint(mixed)
    assert apart.watermark_ms == min(apart.feeders.values())


@settings(max_examples=120, deadline=None)
@given(plans=plans, size=st.integers(min_value=1, max_value=6), per_call=st.integers(1, 5))
def test_vectorised_path_equals_the_request_by_request_path_over_several_partitions(
    make_event: MakeEvent, plans: list[Any], size: int, per_call: int
) -> None:
    messages = in_turn(partition_messages(plans, make_event, size))
    fast, slow = both_paths(messages, per_call)
    assert fast.take_changes() == slow.take_changes()
    for w in WINDOW_LENGTHS:
        assert fast.window(w).to_bytes() == slow.window(w).to_bytes()


@settings(max_examples=120, deadline=None)
@given(plan=moves, size=st.integers(min_value=1, max_value=6), per_call=st.integers(1, 5))
def test_a_new_series_on_one_partition_is_folded_as_the_request_by_request_path_does(
    make_event: MakeEvent, plan: list[Any], size: int, per_call: int
) -> None:
    """Its first partition meets no watermark: the batched path takes its first
    batch (out-of-order requests in it judged against the newest before them)."""
    messages = [
        (3, offset, requests)
        for offset, requests in enumerate(in_messages(stream(plan, make_event), size))
    ]
    fast, slow = both_paths(messages, per_call)
    assert fast.feeders == slow.feeders
    assert fast.watermark_ms == slow.watermark_ms
    assert fingerprint(fast) == fingerprint(slow)


def test_a_partition_behind_holds_the_close_back_and_its_requests_are_not_late(
    make_event: MakeEvent,
) -> None:
    windows = SeriesWindows(SMALL)
    ahead = [make_event(T0 + 20_000 + i) for i in range(3)]
    behind = [make_event(T0 + i) for i in range(3)]
    windows.add_columns(columns([(0, 0, [make_event(T0)]), (1, 0, [make_event(T0)])]))
    windows.add_columns(columns([(0, 1, ahead)]))
    assert windows.watermark_ms == T0  # partition 1 is still at T0
    result = windows.add_columns(columns([(1, 1, behind)]))
    assert (result.accepted, result.late) == (3, 0)
    assert windows.watermark_ms == T0 + 2


def test_a_request_older_than_its_own_partition_allows_is_late_whatever_the_others_do(
    make_event: MakeEvent,
) -> None:
    windows = SeriesWindows(SMALL)
    windows.add_columns(columns([(0, 0, [make_event(T0)]), (1, 0, [make_event(T0)])]))
    windows.add_columns(columns([(1, 1, [make_event(T0 + 10_000)])]))
    # Partition 0 is still at T0, so the series' watermark is too; but 5 s before
    # partition 1's own newest request is past its 2 s lateness.
    result = windows.add_columns(columns([(1, 2, [make_event(T0 + 5_000)])]))
    assert (result.accepted, result.late) == (0, 1)


def test_forgetting_a_partition_that_stopped_feeding_lets_the_series_close(
    make_event: MakeEvent,
) -> None:
    windows = SeriesWindows(SMALL)
    windows.add_columns(columns([(0, 0, [make_event(T0)]), (1, 0, [make_event(T0)])]))
    windows.add_columns(columns([(0, 1, [make_event(T0 + 30_000)])]))
    assert windows.watermark_ms == T0
    closed = windows.forget_feeder(1)
    assert windows.watermark_ms == T0 + 30_000
    assert closed and closed[0] == T0 - T0 % 1_000 + 1_000
    # Back again, it starts from the series' watermark: old requests are late.
    result = windows.add_columns(columns([(1, 1, [make_event(T0 + 1_000)])]))
    assert (result.accepted, result.late) == (0, 1)


def test_feeders_survive_a_restore(make_event: MakeEvent) -> None:
    windows = SeriesWindows(SMALL)
    windows.add_columns(columns([(0, 0, [make_event(T0)]), (3, 0, [make_event(T0 + 500)])]))
    changes = windows.take_changes()
    restored = SeriesWindows.restore(changes.meta, changes.upserts.get, SMALL)
    assert restored.feeders == {0: T0, 3: T0 + 500}
    assert restored.watermark_ms == T0


def test_a_new_series_takes_the_batched_path_and_a_second_partition_does_not(
    make_event: MakeEvent, monkeypatch: Any
) -> None:
    calls: list[int] = []
    real = fold_module.add_replay

    def counting(state: Any, cols: Columns, on_close: Any) -> AddResult:
        calls.append(len(cols))
        return real(state, cols, on_close)

    monkeypatch.setattr(fold_module, "add_replay", counting)
    windows = SeriesWindows(SMALL)
    first = [make_event(T0 + i, event_id=f"a{i}") for i in range(5)]
    windows.add_columns(columns([(0, 0, first)]))
    assert calls == []
    assert windows.feeders == {0: T0 + 4}
    second = [make_event(T0 + 10 + i, event_id=f"b{i}") for i in range(3)]
    windows.add_columns(columns([(1, 0, second)]))
    assert calls == [3]
