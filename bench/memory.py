"""What holds a worker's memory: RSS sampling from ``/proc`` and an in-process replay.

    python -m bench.memory                (no broker; bench.throughput runs it too)

Two measurements, combined by :mod:`bench.throughput` into ``rss_breakdown_mib``:

- :class:`RssSampler` samples a process's ``/proc/<pid>/status`` (``VmRSS``,
  ``RssAnon``, ``RssFile``) every 0.2 s: the baseline right after the worker
  reports ready (imports, faust, librdkafka, RocksDB stores opened, no event
  yet) and the sample at the peak.
- :func:`replay` builds, in this process and without faust or Kafka, the state
  the throughput benchmark's worker builds: the same messages
  (:func:`bench.workload.make_messages`) decoded, routed and folded into
  :class:`~tailguard.streams.SeriesWindows` exactly as the SLI agent does, the
  changed series checkpointed into RocksDB stores (one per partition, the
  worker's options) every ``CHECKPOINT_EVENTS`` events. It reports the RSS the
  series state adds (and its Python-heap part from ``tracemalloc``), what its
  parts weigh (event-id sets, exact values, digests, exemplars), and RocksDB's
  own counters (``rocksdb.cur-size-all-mem-tables``,
  ``rocksdb.block-cache-usage``).
"""

import contextlib
import ctypes
import gc
import json
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
from faust.stores.rocksdb import RocksDBOptions
from tailguard.agents.internal import decode_groups, route
from tailguard.agents.settings import Settings
from tailguard.agents.state import bucket_key
from tailguard.schemas import Limits, decode
from tailguard.streams import RingConfig, SeriesWindows
from tailguard.streams.digest import Sketch
from tailguard.streams.fold import fold_many

__all__ = ["RssSampler", "proc_memory", "replay"]

_MIB = 1024 * 1024
#: Events between two checkpoints of the replay (a worker at ~11,000 events/s
#: checkpoints every 5 s).
CHECKPOINT_EVENTS = 50_000
_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")


def proc_memory(pid: int | str = "self") -> dict[str, float]:
    """``VmRSS``, ``VmHWM``, ``RssAnon``, ``RssFile``, ``RssShmem`` of ``pid`` in MiB."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in _FIELDS:
            out[name] = int(rest.split()[0]) / 1024
    return out


class RssSampler:
    """Samples a process's memory in a thread; keeps the baseline, the peak and a timeline."""

    def __init__(self, pid: int, every_s: float = 0.2) -> None:
        self.pid = pid
        self.every_s = every_s
        self.baseline: dict[str, float] | None = None
        self.peak: dict[str, float] = {}
        self.peak_at_s = 0.0
        self.timeline: list[tuple[float, float]] = []
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "RssSampler":
        self._thread.start()
        return self

    def mark_baseline(self) -> None:
        """Record the current sample as the baseline (call when the worker is ready)."""
        self.baseline = proc_memory(self.pid)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                now = proc_memory(self.pid)
            except (FileNotFoundError, ProcessLookupError):
                return
            t = time.monotonic() - self._t0
            if not self.timeline or t - self.timeline[-1][0] >= 2.0:
                self.timeline.append((round(t, 1), round(now["VmRSS"], 1)))
            if now.get("VmRSS", 0.0) > self.peak.get("VmRSS", 0.0):
                self.peak, self.peak_at_s = now, t

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _trim() -> None:
    """Give freed heap back to the OS (glibc), so RSS deltas show live memory only."""
    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _rss() -> float:
    return proc_memory()["VmRSS"]


def _ndarray_bytes(a: np.ndarray | None) -> int:
    return 0 if a is None else int(a.nbytes) + sys.getsizeof(np.empty(0))


#: One request id as a bucket's ``ids`` holds it (a 64-bit hash, a Python int):
#: counted, not measured one by one (the probe walks every series under the GIL).
_ID_BYTES = sys.getsizeof(2**63 - 1)


def _parts(states: list[SeriesWindows]) -> dict[str, Any]:
    """What the series' buckets hold (Python-visible bytes; digests counted)."""
    ids = exact = tails = kept = exemplars = 0
    digests = buckets = open_ids = views = cached = cached_digests = 0
    for state in states:
        # Merged closed buckets kept for snapshots (SeriesWindows._closed_cache).
        for merged in state._closed_cache.values():
            cached += 1
            for sketch in merged.digests.values():
                if isinstance(sketch, Sketch):
                    cached_digests += sketch._digest is not None
                    views += sketch._view is not None
                    exact += _ndarray_bytes(sketch._values)
        for bucket in (*state.fine.values(), *state.coarse.values()):
            buckets += 1
            if bucket.ids:
                open_ids += 1
                ids += sys.getsizeof(bucket.ids) + len(bucket.ids) * _ID_BYTES
            exemplars += sum(sys.getsizeof(t) + sys.getsizeof(t[1]) for t in bucket.exemplars)
            for sketch in bucket.digests.values():
                if not isinstance(sketch, Sketch):
                    continue
                exact += _ndarray_bytes(sketch._values)
                tails += _ndarray_bytes(sketch._tail) if sketch._tail.size else 0
                # Chunks a digest merged since its last record, kept for the next.
                kept += sum(_ndarray_bytes(c) for c in sketch._merged or ())
                digests += sketch._digest is not None
                views += sketch._view is not None
    return {
        "buckets": buckets,
        "closed_cache_buckets": cached,
        "closed_cache_digests": cached_digests,
        "digest_views": views,
        "buckets_with_ids": open_ids,
        "digests": digests,
        "ids_mib": round(ids / _MIB, 1),
        "exact_values_mib": round(exact / _MIB, 1),
        "digest_tails_mib": round(tails / _MIB, 1),
        "kept_since_record_mib": round(kept / _MIB, 1),
        "exemplars_mib": round(exemplars / _MIB, 1),
    }


def digest_native_bytes(max_centroids: int = 1000, n: int = 2000) -> float:
    """RSS per fastdigest digest in the form buckets hold them (one 1,024-value chunk merged)."""
    _trim()
    before = _rss()
    rng = np.random.default_rng(0)
    keep = []
    for _ in range(n):
        sketch = Sketch(max_centroids)
        sketch.add(rng.lognormal(3.4, 0.35, 1100))
        keep.append(sketch)
    _trim()
    grown = (_rss() - before) * _MIB
    exact = sum(_ndarray_bytes(s._tail) for s in keep)
    return max(grown - exact, 0.0) / n


def _open_stores(root: Path, partitions: int) -> dict[str, list[Any]]:
    opts = {k: v for k, v in Settings().rocksdb_options().items() if k != "driver"}
    options = RocksDBOptions(**opts)  # type: ignore[arg-type]
    return {
        name: [options.open(root / f"{name}-{p}.db") for p in range(partitions)]
        for name in ("series", "buckets")
    }


def _rocksdb_usage(stores: dict[str, list[Any]]) -> dict[str, float]:
    mem = cache = 0
    for dbs in stores.values():
        for db in dbs:
            mem += db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0
            cache += db.property_int_value("rocksdb.block-cache-usage") or 0
    return {"memtables_mib": round(mem / _MIB, 1), "block_cache_mib": round(cache / _MIB, 1)}


def replay(events: int, series: int, partitions: int = 4, *, trace: bool = False) -> dict[str, Any]:
    """Fold the throughput benchmark's input in-process; what the series state and RocksDB hold."""
    from bench.workload import PER_MESSAGE, make_messages

    now = int(time.time() * 1000)
    limits = Limits()
    ring = RingConfig()
    tmp = Path(tempfile.mkdtemp(prefix="tg-mem-"))
    stores = _open_stores(tmp, partitions)
    _trim()
    # Before the input is made: it is let go before the state is measured.
    rss_start = _rss()
    msgs = make_messages(events, series)
    main = msgs[: -(-events // PER_MESSAGE)]  # without the closing requests
    if trace:
        tracemalloc.start()
    states: dict[str, SeriesWindows] = {}
    part_of: dict[str, int] = {}
    rocks_peak = {"memtables_mib": 0.0, "block_cache_mib": 0.0}
    per_batch = CHECKPOINT_EVENTS // PER_MESSAGE
    for lo in range(0, len(main), per_batch):
        valid, positions = [], []
        for j, raw in enumerate(main[lo : lo + per_batch]):
            decoded = decode(raw, "inference", now_ms=now, limits=limits)
            valid.extend(decoded.valid)
            positions.extend([(j % partitions, lo + j)] * len(decoded.valid))
        for partition, value in route(valid, positions, partitions):
            groups = decode_groups(value)
            batch = []
            for s in groups.series:
                key = "\x1e".join(s)
                if key not in states:
                    stores["series"][partition].get(key.encode())  # the worker's first read
                    states[key] = SeriesWindows(ring)
                    part_of[key] = partition
                batch.append(states[key])
            fold_many(batch, groups.cols, groups.bounds)
        del valid, positions
        for key, state in states.items():  # checkpoint: what changed goes to RocksDB
            changes = state.take_changes()
            p = part_of[key]
            for record, data in changes.upserts.items():
                stores["buckets"][p].put(bucket_key(key, *record).encode(), data)
            stores["series"][p].put(key.encode(), changes.meta)
        usage = _rocksdb_usage(stores)
        for k, v in usage.items():
            rocks_peak[k] = max(rocks_peak[k], v)
    del msgs, main
    heap = tracemalloc.get_traced_memory()[0] if trace else 0
    tracemalloc.stop()
    _trim()
    rss_state = _rss() - rss_start
    # RocksDB's own allocations are native (not in tracemalloc); count them apart.
    rocks_now = _rocksdb_usage(stores)
    live = list(states.values())
    n_digests = _parts(live)["digests"]
    per_digest = digest_native_bytes(ring.max_centroids)
    result = {
        "series": len(states),
        "events": events,
        "series_state_mib": round(rss_state - rocks_now["memtables_mib"], 1),
        "series_state_python_heap_mib": round(heap / _MIB, 1) if trace else None,
        "bytes_per_series": round((rss_state - rocks_now["memtables_mib"]) * _MIB / len(states)),
        "parts": {
            **_parts(live),
            "digest_native_mib": round(n_digests * per_digest / _MIB, 1),
            "digest_native_bytes_each": round(per_digest),
        },
        "rocksdb_peak": rocks_peak,
        "rocksdb_stores": sum(len(v) for v in stores.values()),
    }
    for dbs in stores.values():
        for db in dbs:
            db.close()
    return result


_MALLINFO2 = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks")
_MALLINFO2 += ("fsmblks", "uordblks", "fordblks", "keepcost")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2]


def _malloc_free_mib() -> float:
    """Bytes glibc holds free in its heaps (all arenas): freed, not given back."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        return float(libc.mallinfo2().fordblks) / _MIB
    except (OSError, AttributeError):
        return 0.0


def _channel_bytes(app: Any) -> tuple[int, float]:
    """Messages fetched into the agents' stream buffers and not yet taken, and their bytes."""
    n, size = 0, 0
    for agent in list(app.agents.values()):
        for actor in list(getattr(agent, "_actors", ()) or ()):
            chan = getattr(getattr(actor, "stream", None), "channel", None)
            queue = getattr(chan, "_queue", None)
            items = list(getattr(queue, "_queue", ()) or ())
            n += len(items)
            for ev in items:
                value = getattr(getattr(ev, "message", None), "value", None)
                size += len(value) if isinstance(value, bytes | bytearray) else 0
    return n, size / _MIB


def _probe(app: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"rss": proc_memory()}
    mem = cache = readers = 0
    stores = 0
    for table in list(app.tables.values()):
        for db in list(getattr(table.data, "_dbs", {}).values()):
            stores += 1
            mem += db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0
            cache += db.property_int_value("rocksdb.block-cache-usage") or 0
            readers += db.property_int_value("rocksdb.estimate-table-readers-mem") or 0
    out["rocksdb"] = {
        "stores": stores,
        "memtables_mib": round(mem / _MIB, 1),
        "block_cache_mib": round(cache / _MIB, 1),
        "table_readers_mib": round(readers / _MIB, 1),
    }
    n, size = _channel_bytes(app)
    out["stream_buffers"] = {"messages": n, "value_mib": round(size, 1)}
    out["malloc_free_mib"] = round(_malloc_free_mib(), 1)
    return out


def _probe_loop(path: Path, every_s: float, found: dict[str, Any]) -> None:
    """Every ``every_s``: a memory record of the worker whose pipeline ``found`` holds
    (set when the worker builds it); every 10 s from then on its series parts too
    (a walk of every series, under the GIL: rarely), added to the record of the
    peak so far when that record has none."""
    peak = 0.0
    last_series = 0.0
    series: dict[str, Any] = {}
    record: dict[str, Any] = {}
    while True:
        time.sleep(every_s)
        pipeline = found.get("pipeline")
        if pipeline is None:
            continue
        try:
            app = pipeline.app
            if getattr(app, "should_stop", False):
                return  # the stores are closing: leave them alone
            sample = _probe(app)
            now = time.monotonic()
            if not last_series:
                last_series = now  # the first walk 10 s in, once there are series
            elif now - last_series > 10:
                last_series = now
                states = [c.state for _, c in pipeline.store.items()]
                series = {"count": len(states), **_parts(states)}
            sample["series"] = series
            if sample["rss"]["VmRSS"] >= peak:
                peak = sample["rss"]["VmRSS"]
                record = sample
                path.write_text(json.dumps(record))
            elif series and not record.get("series"):
                record["series"] = series
                path.write_text(json.dumps(record))
        except Exception as exc:  # a probe must never stop the worker
            print(f"memory probe: {exc!r}", file=sys.stderr, flush=True)


def probe_worker(argv: list[str]) -> None:
    """Run ``tailguard worker`` with a thread recording its memory at its RSS peak.

    The record (RocksDB counters, faust stream buffers, glibc free heap, series
    parts) is written to ``BENCH_PROBE_OUT`` each time RSS reaches a new high.
    The worker's pipeline is handed to the probe as it is built (the worker then
    freezes its start-up heap, which hides it from ``gc.get_objects``; searching
    the heap for it every second held the GIL for a fifth of the worker's time).
    """
    import os

    from tailguard.agents import worker

    found: dict[str, Any] = {}
    build = worker.build

    def build_and_note(settings: Any) -> Any:
        found["pipeline"] = pipeline = build(settings)
        return pipeline

    worker.build = build_and_note
    path = Path(os.environ["BENCH_PROBE_OUT"])
    threading.Thread(target=_probe_loop, args=(path, 1.0, found), daemon=True).start()
    from tailguard.cli import main as cli_main

    sys.argv = ["tailguard", *argv]
    cli_main()


def main() -> None:
    if sys.argv[1:2] == ["worker"]:
        probe_worker(sys.argv[1:])
        return
    from bench.throughput import EVENTS, SERIES

    print(json.dumps(replay(EVENTS, SERIES, trace=True), indent=2), flush=True)


if __name__ == "__main__":
    main()
