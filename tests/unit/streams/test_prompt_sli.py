"""Per-prompt-group SLI state: event-time windows, lateness, compliance, bytes."""

import pytest
from tailguard.streams.errors import ConfigError, CorruptStateError
from tailguard.streams.prompt_sli import CANCELLED, ERROR, GOOD, SLOW, GroupSli

T0 = 1_699_995_600_000  # minute-aligned
MIN = 60_000


def test_a_window_closes_when_event_time_passes_its_end_plus_lateness() -> None:
    st = GroupSli(window_ms=MIN, lateness_ms=10_000)
    assert st.add(T0 + 1_000, "v1", GOOD, 100.0) == []
    assert st.add(T0 + MIN + 9_000, "v2", SLOW, 900.0) == []  # within lateness
    closed = st.add(T0 + MIN + 10_000, "v1", GOOD, 120.0)
    assert [w.start_ms for w in closed] == [T0]
    assert closed[0].tally.requests == 1
    assert list(st.open) == [T0 + MIN]


def test_an_event_of_a_closed_window_is_late_not_merged() -> None:
    st = GroupSli(window_ms=MIN, lateness_ms=0)
    st.add(T0, "v1", GOOD, 100.0)
    st.add(T0 + MIN, "v1", GOOD, 100.0)  # closes [T0, T0+1m)
    assert st.add(T0 + 5, "v1", ERROR, None) == []
    assert st.late == 1
    assert st.open[T0 + MIN].tally.requests == 1
    assert st.total.requests == 3 and st.total.errors == 1


def test_compliance_counts_slow_and_errors_as_bad_and_leaves_out_cancelled() -> None:
    st = GroupSli(window_ms=MIN)
    for outcome, ttft in [
        (GOOD, 100.0),
        (GOOD, 200.0),
        (SLOW, 1500.0),
        (ERROR, None),
        (CANCELLED, None),
    ]:
        st.add(T0 + 1, "v1" if ttft != 200.0 else "v2", outcome, ttft)
    t = st.open[T0].tally
    assert (t.requests, t.bad, t.errors, t.cancelled) == (5, 2, 1, 1)
    assert t.slo_compliance == pytest.approx(0.5)
    s = t.summary()
    assert s["versions"] == {"v1": {"count": 4, "bad": 2}, "v2": {"count": 1, "bad": 0}}
    ttft = s["ttft_ms"]
    assert ttft["count"] == 3
    assert ttft["p50"] == pytest.approx(200.0, rel=0.01)
    assert ttft["p99"] == pytest.approx(1500.0, rel=0.01)


def test_empty_tally_has_no_compliance_and_no_quantiles() -> None:
    st = GroupSli()
    st.add(T0, "v", CANCELLED, None)
    s = st.open[T0].tally.summary()
    assert s["slo_compliance"] is None
    assert s["ttft_ms"] == {"p50": None, "p90": None, "p95": None, "p99": None, "count": 0}


def test_bytes_round_trip_and_independence_from_batching() -> None:
    rows = [
        (T0 + i * 7_000, f"v{i % 3}", (GOOD, SLOW, ERROR, CANCELLED)[i % 4], 50.0 + i)
        for i in range(40)
    ]
    whole = GroupSli(window_ms=MIN, lateness_ms=5_000)
    for r in rows:
        whole.add(*r)
    pieces = GroupSli(window_ms=MIN, lateness_ms=5_000)
    for i, r in enumerate(rows):
        if i % 9 == 0:
            pieces = GroupSli.from_bytes(pieces.to_bytes())  # as if stored between messages
        pieces.add(*r)
    assert pieces.to_bytes() == whole.to_bytes()
    again = GroupSli.from_bytes(whole.to_bytes())
    assert again.total.summary() == whole.total.summary()
    assert again.watermark_ms == whole.watermark_ms and again.late == whole.late


def test_bad_config_and_bad_bytes_are_refused() -> None:
    with pytest.raises(ConfigError):
        GroupSli(window_ms=0)
    with pytest.raises(CorruptStateError):
        GroupSli.from_bytes(b"nope")


def test_a_batch_counts_like_its_rows_one_by_one_and_closes_windows_after_it() -> None:
    rows = [(T0 + i * 1_000, f"v{i % 2}", (GOOD, SLOW)[i % 3 == 0], 80.0 + i) for i in range(50)]
    one_by_one = GroupSli(window_ms=MIN, lateness_ms=60_000)
    for r in rows:
        one_by_one.add(*r)
    batched = GroupSli(window_ms=MIN, lateness_ms=60_000)
    assert batched.add_rows(rows) == []
    assert batched.to_bytes() == one_by_one.to_bytes()
    # lateness is judged against event time before the batch: a row of the window
    # the batch itself closes is still counted in it
    st = GroupSli(window_ms=MIN, lateness_ms=0)
    closed = st.add_rows(
        [(T0 + 1, "a", GOOD, 1.0), (T0 + MIN, "a", GOOD, 1.0), (T0 + 2, "b", GOOD, 1.0)]
    )
    assert [w.start_ms for w in closed] == [T0]
    assert closed[0].tally.requests == 2 and st.late == 0
    assert st.add_rows([(T0 + 3, "c", GOOD, 1.0)]) == [] and st.late == 1


def _rows(n: int, start: int = 0) -> list[tuple[int, str, int, float | None]]:
    return [
        (T0 + (start + i) * 1_000, f"v{i % 2}", (GOOD, SLOW, ERROR)[i % 3], 90.0 + i)
        for i in range(n)
    ]


def test_a_re_forwarded_batch_is_skipped_and_counts_like_once() -> None:
    rows = _rows(12)
    # three input messages of partition 0, four requests each
    positions = [(0, 40 + i // 4) for i in range(12)]
    once = GroupSli(window_ms=MIN, lateness_ms=MIN)
    once.add_rows(rows, positions)
    twice = GroupSli(window_ms=MIN, lateness_ms=MIN)
    twice.add_rows(rows, positions)
    # the crash: state stored, input not committed; the same events come again, as a
    # new message, partly overlapping the next input message (offset 43)
    twice = GroupSli.from_bytes(twice.to_bytes())
    more = _rows(4, start=12)
    twice.add_rows(rows[4:] + more, positions[4:] + [(0, 43)] * 4)
    once.add_rows(more, [(0, 43)] * 4)
    assert twice.total.summary() == once.total.summary()
    assert twice.open[T0].tally.summary() == once.open[T0].tally.summary()
    assert twice.total.requests == 16 and twice.applied == {0: 43}
    assert twice.to_bytes() == once.to_bytes()


def test_rows_of_two_input_partitions_interleaved_are_all_counted() -> None:
    rows = _rows(8)
    # partition 1 is far ahead of partition 0: its offsets must not hide partition 0's
    positions = [(0, 5), (1, 900), (0, 6), (1, 901), (0, 7), (1, 902), (0, 8), (1, 903)]
    st = GroupSli(window_ms=MIN)
    for row, pos in zip(rows, positions, strict=True):
        st.add_rows([row], [pos])
    assert st.total.requests == 8 and st.applied == {0: 8, 1: 903}
    st.add_rows(rows, positions)  # the same again, as one batch
    assert st.total.requests == 8
    # one input message's requests in one call are all counted, not taken for a replay
    st.add_rows([(T0 + 50, "v9", GOOD, 1.0)] * 3, [(0, 9)] * 3)
    assert st.total.requests == 11 and st.total.versions["v9"] == [3, 0]


def test_rows_without_a_position_are_always_counted() -> None:
    st = GroupSli(window_ms=MIN)
    st.add_rows(_rows(2), [(0, 3), (0, 3)])
    st.add_rows(_rows(2), [(-1, -1), (-1, -1)])
    assert st.total.requests == 4 and st.applied == {0: 3}
    with pytest.raises(ValueError, match="one per row"):
        st.add_rows(_rows(2), [(0, 4)])


def test_state_written_before_replay_marks_restores_with_none() -> None:
    import msgspec

    st = GroupSli(window_ms=MIN, lateness_ms=5_000)
    st.add_rows(_rows(5))
    # the version-1 layout without the trailing ``applied`` field
    fields = msgspec.msgpack.decode(st.to_bytes())
    old = msgspec.msgpack.encode(fields[:-1])
    restored = GroupSli.from_bytes(old)
    assert restored.applied == {}
    assert restored.total.summary() == st.total.summary()
    assert restored.to_bytes() == st.to_bytes()
    restored.add_rows(_rows(5), [(2, 7)] * 5)  # the first positioned rows are counted
    assert restored.total.requests == 10 and restored.applied == {2: 7}
