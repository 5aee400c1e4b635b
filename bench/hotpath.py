"""Per-stage cost of the hot path, without Kafka: where a worker's time per event goes.

    python -m bench.hotpath               (make bench runs it too)

Feeds the benchmark's own messages (10,000 series, 200 events a message)
through each stage in-process, two batches of 100,000 events (the second
is timed, so buckets exist as in steady state), and writes
``bench/results/hotpath.json`` with events/s and µs per event per stage:

- ``decode``: JSON → validated ``InferenceEvent`` (msgspec + bad-input checks);
- ``group``: each event's series and home partition, then per partition the
  columns grouped by series (what the ingest agent folds in place: the input
  is partitioned by series, as the project's producers send it);
- ``fold``: ``fold_many`` into the windows;
- ``checkpoint_bytes``: serialising every changed series (``take_changes``).
"""

import gc
import json
import time

from tailguard.agents.internal import group_series
from tailguard.schemas import Limits, decode
from tailguard.streams import RingConfig, SeriesWindows
from tailguard.streams.fold import fold_many

from bench.common import machine, write_result
from bench.throughput import PARTITIONS, make_placed_messages

BATCH = 500  # input messages per ingest batch (the worker's default)


def main() -> None:
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    msgs = make_placed_messages(2 * BATCH * 200, 10_000)[: 2 * BATCH]
    now = int(time.time() * 1000)
    limits = Limits()
    states: dict[tuple[str, str, str, str], SeriesWindows] = {}
    timings: dict[str, float] = {}
    events = 0
    for round_ in range(2):
        batch = msgs[round_ * BATCH : (round_ + 1) * BATCH]
        t0 = time.perf_counter()
        valid, positions = [], []
        for j, (part, raw) in enumerate(batch):
            decoded = decode(raw, "inference", now_ms=now, limits=limits)
            valid.extend(decoded.valid)
            positions.extend([(part, round_ * BATCH + j)] * len(decoded.valid))
        t1 = time.perf_counter()
        by_partition: dict[int, list[int]] = {}
        for i, (part, _) in enumerate(positions):
            by_partition.setdefault(part, []).append(i)
        grouped = [
            group_series([valid[i] for i in rows], [positions[i] for i in rows])
            for rows in by_partition.values()
        ]
        t2 = time.perf_counter()
        for groups in grouped:
            series = [states.setdefault(s, SeriesWindows(RingConfig())) for s in groups.series]
            fold_many(series, groups.cols, groups.bounds)
        t3 = time.perf_counter()
        for state in states.values():
            state.take_changes()
        t4 = time.perf_counter()
        events = len(valid)
        timings = {
            "decode": t1 - t0,
            "group": t2 - t1,
            "fold": t3 - t2,
            "checkpoint_bytes": t4 - t3,
        }
    stages = {
        name: {"events_per_s": round(events / s), "us_per_event": round(s / events * 1e6, 2)}
        for name, s in timings.items()
    }
    total = sum(timings.values())
    result = {
        "events": events,
        "series": 10_000,
        "partitions": PARTITIONS,
        "stages": stages,
        "all_stages_events_per_s": round(events / total),
        "machine": machine("in-process, no Kafka"),
        "command": "python -m bench.hotpath",
    }
    write_result("hotpath", result)
    print(json.dumps(result, indent=2), flush=True)


if __name__ == "__main__":
    main()
