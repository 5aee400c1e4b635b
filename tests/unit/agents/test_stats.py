"""The worker's counters line: what it reports and the garbage collector's clock."""

import gc

from tailguard.agents.stats import WorkerStats, time_gc


def test_the_counters_line_reports_close_checkpoint_and_collector_seconds() -> None:
    stats = WorkerStats(close_seconds=1.25, checkpoint_seconds=2.0, gc_seconds=0.5)
    line = stats.line()
    assert "close_s=1.25" in line and "checkpoint_s=2.0" in line and "gc_s=0.50" in line


def test_the_counters_line_reports_the_ingest_stages_and_the_capacity_paths() -> None:
    stats = WorkerStats(
        decode_seconds=0.5,
        dispatch_seconds=0.25,
        fold_seconds=1.5,
        capacity_in_place=7,
        capacity_forwarded=3,
        events_local=11,
        events_forwarded=2,
    )
    line = stats.line()
    assert "decode_s=0.50 dispatch_s=0.25 fold_s=1.50" in line
    assert "cap_in_place=7 cap_forwarded=3" in line
    # The series paths keep their own counts (benchmarks read "local=… forwarded=…").
    assert "local=11 forwarded=2 " in line


def test_every_collection_adds_its_time_to_the_stats() -> None:
    stats = WorkerStats()
    before = list(gc.callbacks)
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection in between: only the two below
    time_gc(stats)
    try:
        # A heap of cyclic garbage: a full collection has something to walk.
        for _ in range(20_000):
            a: list[object] = []
            a.append(a)
        assert stats.gc_seconds == 0.0
        gc.collect()
        first = stats.gc_seconds
        assert first > 0.0
        gc.collect()
        assert stats.gc_seconds > first
    finally:
        gc.callbacks[:] = before
        if was_enabled:
            gc.enable()
