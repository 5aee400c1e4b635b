"""Per-stage cost of the hot path, without Kafka: where a worker's time per event goes.

    python -m bench.hotpath               (make bench runs it too)

Feeds the benchmark's own messages (10,000 series, 200 events a message)
through each stage in-process, ``ROUNDS`` batches of 100,000 events (the
first warms up, so buckets exist as in steady state; each stage's figure is
its fastest of the others: this shared machine drifts by ±20 % from one
second to the next), and writes
``bench/results/hotpath.json`` with events/s and µs per event per stage:

- ``decode``: a message → validated requests (columnar messages, as this
  project's producers send them, into lists; ``BENCH_ENCODING=rows`` for JSON
  arrays of request objects, into ``InferenceEvent`` records), gathered in a
  ``RequestBatch``;
- ``group``: each request's series, then per partition the columns grouped
  by series (what the ingest agent folds in place: the input
  is partitioned by series, as the project's producers send it);
- ``fold``: ``fold_many`` into the windows;
- ``checkpoint_bytes``: serialising every changed series (``take_changes``);
- ``checkpoint_write``: writing them as a checkpoint does
  (:class:`~tailguard.agents.bulk.BulkWriter`: each partition and table at
  once, into real RocksDB without its log, and their changelog records queued
  in librdkafka — to an address nothing listens on: the cost of queueing, not
  of the broker).

A checkpoint writes every series that changed since the last one, whatever
number of events changed it, so its cost per event depends on how many events
arrive between two: the worker checkpoints each partition every
``checkpoint_interval_s`` (5 s; longer under load, ``agents/cadence.py``), which
at the 150,000 events/s this figure is held to is 750,000 events. Here a
checkpoint follows every ``CHECKPOINT_EVERY`` batches (3: 300,000 events, on the
safe side); ``checkpoint_per_series_us`` is its cost per series written,
whatever the cadence.

The garbage collector is paused through every stage, as the ingest agent
pauses it from a batch's decoding to the end of its fold; ``decode_gc``
compares decoding one batch (kept alive, as the agent keeps it) with the
collector paused and with Python's default collector settings.
"""

import gc
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rocksdict import Options, Rdict
from tailguard.agents.bulk import BulkWriter
from tailguard.agents.ingest import gc_paused
from tailguard.agents.internal import columns_by_partition
from tailguard.agents.outputs import Outputs
from tailguard.agents.requests import RequestBatch
from tailguard.agents.state import bucket_key
from tailguard.schemas import Limits, decode
from tailguard.schemas.columnar import decode_columns, is_columnar
from tailguard.streams import RingConfig, SeriesWindows
from tailguard.streams.fold import fold_many
from tailguard.streams.fold_batch import Ledger

from bench.common import machine, write_result
from bench.throughput import ENCODING
from bench.workload import PARTITIONS, make_placed_messages

BATCH = 500  # input messages per ingest batch (the worker's default)
#: Batches between two checkpoints (see the module docstring).
CHECKPOINT_EVERY = 3
#: Checkpoints timed, after one warm-up batch and its checkpoint (each stage's
#: fastest batch, and the fastest checkpoint, count).
CHECKPOINTS = 2
ROUNDS = 1 + CHECKPOINT_EVERY * CHECKPOINTS


class _Store:
    """The part of faust's RocksDB store :class:`BulkWriter` uses, over real RocksDB."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._dbs: dict[int, Rdict] = {}

    def _db_for_partition(self, partition: int) -> Rdict:
        if partition not in self._dbs:
            self._dbs[partition] = Rdict(str(self.root / str(partition)), Options(raw_mode=True))
        return self._dbs[partition]


class _Topic:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_topic_name(self) -> str:
        return self.name


class _Table:
    def __init__(self, root: Path, name: str) -> None:
        self.data = _Store(root / name)
        self.changelog_topic = _Topic(f"hotpath-{name}-changelog")


def _decode_with_and_without_gc(
    batch: list[tuple[int, bytes]], now: int, limits: Limits
) -> dict[str, float]:
    """µs per event to decode one batch, kept alive as the ingest agent keeps it,
    with the collector paused and with Python's default collector settings
    (fastest of ``ROUNDS`` each, alternating)."""
    best = {"paused": float("inf"), "default": float("inf")}
    frozen = gc.get_threshold()
    for _ in range(ROUNDS):
        for mode in best:
            kept: list[Any] = []
            count = 0
            if mode == "default":
                gc.set_threshold(700, 10, 10)
                gc.enable()
            else:
                gc.disable()
            started = time.perf_counter()
            for _, raw in batch:
                if is_columnar(raw):
                    kept.append(decode_columns(raw, now_ms=now, limits=limits))
                    count += len(kept[-1])
                else:
                    kept.extend(decode(raw, "inference", now_ms=now, limits=limits).valid)
                    count = len(kept)
            seconds = time.perf_counter() - started
            gc.set_threshold(*frozen)
            gc.enable()
            best[mode] = min(best[mode], seconds / count)
            del kept
            gc.collect()
    return {f"us_per_event_gc_{mode}": round(s * 1e6, 2) for mode, s in best.items()}


def main() -> None:
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    msgs = make_placed_messages(ROUNDS * BATCH * 200, 10_000, encoding=ENCODING)[: ROUNDS * BATCH]
    now = int(time.time() * 1000)
    limits = Limits()
    states: dict[tuple[str, str, str, str], SeriesWindows] = {}
    home: dict[tuple[str, str, str, str], int] = {}
    events = 0
    root = Path(tempfile.mkdtemp(prefix="tg-hotpath-"))
    writer = BulkWriter(Outputs("127.0.0.1:9"))
    tables: dict[str, Any] = {name: _Table(root, name) for name in ("series", "buckets")}
    best: dict[str, float] = {}
    ring = RingConfig()
    since_checkpoint = 0
    ledger = Ledger()  # as the worker folds: batches put in at the next read
    per_series = float("inf")
    written = 0

    def new_state(series: tuple[str, str, str, str]) -> SeriesWindows:
        state = states[series] = SeriesWindows(ring)
        return state

    for round_ in range(ROUNDS):
        batch = msgs[round_ * BATCH : (round_ + 1) * BATCH]
        with gc_paused():  # as the ingest agent processes a batch
            t0 = time.perf_counter()
            requests = RequestBatch()
            for j, (part, raw) in enumerate(batch):
                if is_columnar(raw):
                    columns = decode_columns(raw, now_ms=now, limits=limits)
                    requests.add_columns(part, round_ * BATCH + j, columns)
                else:
                    rows = decode(raw, "inference", now_ms=now, limits=limits).valid
                    requests.add_rows(part, round_ * BATCH + j, rows)
            t1 = time.perf_counter()
            # As the ingest agent does: every request's series once, then per partition.
            by_partition = columns_by_partition(
                requests.columns(),
                requests.gid,
                requests.series,
                requests.served(),
                np.arange(len(requests)),
            )
            grouped = list(by_partition.values())
            t2 = time.perf_counter()
            for (part, _), groups in zip(by_partition.items(), grouped, strict=True):
                series = [states.get(s) or new_state(s) for s in groups.series]
                home.update((s, part) for s in groups.series)
                fold_many(series, groups.cols, groups.bounds, ledger=ledger)
            t3 = time.perf_counter()
        events = len(requests)
        since_checkpoint += events
        timings = {"decode": t1 - t0, "group": t2 - t1, "fold": t3 - t2}
        if round_ > 0:
            for name, seconds in timings.items():
                best[name] = min(best.get(name, float("inf")), seconds / events)
        if round_ % CHECKPOINT_EVERY:
            continue
        with gc_paused():
            t3 = time.perf_counter()
            changed = {s: state.take_changes() for s, state in states.items()}
            t4 = time.perf_counter()
            for part in range(PARTITIONS):
                buckets, metas = [], []
                for s, changes in changed.items():
                    if home[s] != part:
                        continue
                    key = "|".join(s)
                    buckets += [(bucket_key(key, *r), d) for r, d in changes.upserts.items()]
                    metas.append((key, changes.meta))
                writer.write(tables["buckets"], part, buckets)
                writer.write(tables["series"], part, metas)
            t5 = time.perf_counter()
        if round_ > 0:
            for name, seconds in (("checkpoint_bytes", t4 - t3), ("checkpoint_write", t5 - t4)):
                best[name] = min(best.get(name, float("inf")), seconds / since_checkpoint)
            written = sum(1 for c in changed.values() if c.upserts)
            per_series = min(per_series, (t5 - t3) / max(1, written))
        since_checkpoint = 0
    stages = {
        name: {"events_per_s": round(1 / s), "us_per_event": round(s * 1e6, 2)}
        for name, s in best.items()
    }
    total = sum(best.values())
    gc_effect = _decode_with_and_without_gc(msgs[:BATCH], now, limits)
    result = {
        "events": events,
        "batches_timed": ROUNDS - 1,
        "checkpoint_every_batches": CHECKPOINT_EVERY,
        "checkpoint_series": written,
        "checkpoint_per_series_us": round(per_series * 1e6, 1),
        "series": 10_000,
        "partitions": PARTITIONS,
        "encoding": ENCODING,
        "stages": stages,
        "all_stages_events_per_s": round(1 / total),
        "decode_gc": gc_effect,
        "machine": machine("in-process, no Kafka"),
        "command": "python -m bench.hotpath",
    }
    write_result("hotpath", result)
    print(json.dumps(result, indent=2), flush=True)


if __name__ == "__main__":
    main()
