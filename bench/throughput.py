"""Throughput benchmark through the real broker: one worker vs a bare consumer.

    python -m bench.throughput            (make bench starts the test broker first)

1. Pre-loads ``BENCH_EVENTS`` inference events (default 600,000; ~300 bytes
   each with 9 ITL gaps, 200 per message, over ``BENCH_SERIES`` = 10,000
   series) into a fresh topic namespace. Event time advances 100 requests per
   millisecond — a service doing 100,000 requests/s — and one closing request
   per series follows, so every series closes its minutes and publishes
   *final* snapshots.
2. *Ceiling*: a bare confluent-kafka consumer reads the same topic and decodes
   every message with msgspec (rows into typed events, columns into typed
   lists) — the most any Python consumer of this topic could do on this
   machine, measured in the same run.
3. *Worker*: one ``tailguard worker`` subprocess with every agent on (ingest,
   SLI, breach evaluation, GPU join); the clock runs from the moment it
   reports ready to the moment its final 1-minute snapshots account for every
   event; its peak RSS (VmHWM) is read from ``/proc``.

Messages are columnar (``tailguard.inference.columns.v1``: one array per
field, what this project's producers send; ``BENCH_ENCODING=rows`` for JSON
arrays of request objects); ``other_encoding`` repeats the main run with the
other one.

Input layouts: *by series* (default; every message holds events whose series
share a home partition and goes to that partition, as every producer this
project ships does: the worker folds them with one broker hop) and *random*
(messages of random series on arbitrary partitions: every event takes the
forward hop through ``tailguard.internal.series``). The main figures are by
series; ``random_partitions`` repeats the run at random.

4. *Series sweep*: the same number of events over fewer series
   (``BENCH_SERIES_SWEEP``, default ``100``; empty to skip), each in a fresh
   namespace and worker. A worker's cost has a per-event part (decode, fold)
   and a per-series part (a series' share of every batch, its minute close, its
   checkpoint records); the sweep shows which one bounds the main run.
5. *Sustained* (``sustained``): the main case over ``BENCH_SUSTAINED_EVENTS``
   (default 3,000,000: 30 s of event time; 0 to skip). In the main run each
   series' open minute is checkpointed once; here it fills over several
   checkpoints and provisional snapshots, as in production, so what a
   checkpoint costs per event shows (``checkpoints``, ``checkpoint_s_in_worker``).

``close_minute_s`` is the close of the minute alone: the closing requests
(one per series, past every series' last bucket and the lateness) go to the
topic only once the worker has folded every other request, and the clock runs
from their delivery to the broker to the last final 1-minute snapshot read
back — the worker's pickup and fold of those requests, the close of every
series' minute (final 1m, 5m and 1h snapshots, SLO and silent evaluations),
publishing and delivery. (Sent with the rest, they could land in the same
ingest batch as the last requests, and the close was then hidden in that
batch's fold: 0.1–0.2 s, against several seconds otherwise.)
``read_lag_s`` is how long after the worker produced the last of those snapshots
the reader had it (the record's timestamp against the reader's clock): the
reader waits at most ``READ_WAIT_S`` (20 ms) for more records before it looks
at what it read. ``close_floor_s`` is the part of ``close_minute_s`` that is
not the worker's: the broker's round trip of the closing requests and of the
30,000 snapshot records with a bare process in the worker's place
(:mod:`bench.close_floor`, the fastest of three rounds).
``close_s_in_worker`` is the worker's own count (``close_s`` of its counters
line, ``tailguard_close_seconds`` on /metrics): the time it spent closing
minutes — final snapshots, SLO and silent evaluations — over the whole run.
``worker_stages_s`` splits the ingest's time the same way (its counters line,
``tailguard_ingest_*_seconds`` on /metrics): decoding, dispatching (forwarding
and the A/B, prompt and capacity paths), folding (closes included), and
checkpoints and garbage collection beside them.

Writes ``bench/results/throughput.json``. Absolute numbers drift on shared
machines; the ratio to the ceiling is the figure to compare across runs.
``BENCH_PROFILE=out.txt`` records the worker with py-spy (raw format).
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from tailguard.schemas import InferenceEvent
from tailguard.schemas.columnar import InferenceColumns, is_columnar

from bench import close_floor
from bench.common import (
    broker_pids,
    cpu_seconds,
    machine,
    run,
    worker_checkpoints,
    worker_close_s,
    worker_counters,
    worker_paths,
    worker_stages,
    write_result,
)
from bench.kafka_io import BROKER, READ_WAIT_S, preload, read_snapshot
from bench.memory import RssSampler, proc_memory, replay
from bench.workload import PARTITIONS, PER_MESSAGE, PER_MS, Placed, make_placed_workload
from tailguard.catalogue import catalogue
from tailguard.kafka_admin import create_topics

EVENTS = int(os.environ.get("BENCH_EVENTS", "600000"))
SERIES = int(os.environ.get("BENCH_SERIES", "10000"))
#: How the benchmark's producer writes messages: ``columns`` (what this project's
#: producers send) or ``rows`` (a JSON array of request objects).
ENCODING = os.environ.get("BENCH_ENCODING", "columns")
#: Rounds of the close's floor (:mod:`bench.close_floor`); the fastest counts.
FLOOR_ROUNDS = 3
SWEEP = [int(x) for x in os.environ.get("BENCH_SERIES_SWEEP", "100").split(",") if x.strip()]
#: Events of the sustained run (30 s of event time at 100,000 requests/s; 0 to skip).
SUSTAINED = int(os.environ.get("BENCH_SUSTAINED_EVENTS", "3000000") or 0)


def ceiling(topic: str, n_msgs: int) -> tuple[float, int]:
    """Bare consume + typed decode of every message (rows into records, columns into
    lists); returns (seconds, events)."""
    rows = msgspec.json.Decoder(list[InferenceEvent]).decode
    columns = msgspec.json.Decoder(InferenceColumns).decode

    def count(value: bytes) -> int:
        if is_columnar(value):
            return len(columns(value).requests.event_id)
        return len(rows(value))

    c = Consumer(
        {
            "bootstrap.servers": BROKER,
            "group.id": f"ceil-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52428800,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen = events = 0
    t0 = None
    while seen < n_msgs:
        for m in c.consume(1000, timeout=1.0):
            if m.error():
                continue
            if t0 is None:
                t0 = time.perf_counter()
            events += count(m.value())
            seen += 1
    elapsed = time.perf_counter() - (t0 or time.perf_counter())
    c.close()
    return elapsed, events


def _ready(log_path: Path) -> bool:
    return b"Ready" in log_path.read_bytes()


def run_worker(prefix: str, app_id: str, total: int, closing: Placed) -> dict[str, Any]:
    """Run one worker over the pre-loaded topic; time it from ready to fully accounted.

    Once the ``total`` requests are folded, the ``closing`` messages go to the topic:
    the close of the minute is timed from there to its last final snapshot read."""
    sli_topic = prefix + "tailguard.sli"
    data = Path(tempfile.mkdtemp(prefix="tg-bench-"))
    env = {
        **os.environ,
        "TAILGUARD_BROKER": BROKER,
        "TAILGUARD_TOPIC_PREFIX": prefix,
        "TAILGUARD_APP_ID": app_id,
        "TAILGUARD_PARTITIONS": str(PARTITIONS),
        "TAILGUARD_STATS_INTERVAL_S": "0.05",  # the bench sees "all applied" this late at most
        "BENCH_PROBE_OUT": str(data / "probe.json"),
    }
    log_path = data / "worker.log"
    log = log_path.open("wb")
    started = time.perf_counter()
    profile = os.environ.get("BENCH_PROFILE")
    # Only the thread holding the GIL, sampled without pausing the worker: the
    # figures of a profiled run stay those of an unprofiled one.
    spy = ["py-spy", "record", "--gil", "--nonblocking", "-r", "200", "-f", "raw"]
    wrap = [*spy, "-o", profile, "--"] if profile else []
    proc = subprocess.Popen(
        [
            *wrap,
            sys.executable,
            "-m",
            # tailguard.cli with a thread recording the worker's memory at its peak
            "bench.memory",
            "worker",
            "--data-dir",
            str(data / "state"),
            "--snapshot-interval",
            "5",
            "--loglevel",
            "info",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    c = Consumer(
        {
            "bootstrap.servers": BROKER,
            "group.id": f"sli-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    ready_at = None
    applied_at = None
    closing_at = None
    main = total  # the closing requests are sent once these are folded
    seen: set[str] = set()
    series: set[bytes] = set()
    late_total = 0
    counted = 0
    deadline = time.monotonic() + 1200
    done_at = None
    last_sent_ms = 0  # when the worker produced the last final 1-minute snapshot read
    sampler = RssSampler(proc.pid).start()
    brokers = broker_pids()
    cpu_at_ready = (0.0, 0.0)
    try:
        admin = AdminClient({"bootstrap.servers": BROKER})
        md = admin.list_topics(sli_topic, timeout=10).topics[sli_topic]
        c.assign([TopicPartition(sli_topic, p, 0) for p in md.partitions])
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"worker exited with {proc.returncode}; see {log_path}")
            if ready_at is None and _ready(log_path):
                ready_at = time.perf_counter()
                cpu_at_ready = (cpu_seconds([proc.pid]), cpu_seconds(brokers))
                sampler.mark_baseline()
            applied, late_total = worker_counters(log_path)
            if applied_at is None and applied + late_total >= main:
                applied_at = time.perf_counter()
                preload(prefix + "tailguard.inference", closing)
                closing_at = time.perf_counter()
            for m in c.consume(5000, timeout=READ_WAIT_S):
                if m.error():
                    continue
                snap = read_snapshot(m.value())
                if snap.final and snap.window == "1m" and snap.event_id not in seen:
                    seen.add(snap.event_id)
                    counted += snap.count
                    last_sent_ms = max(last_sent_ms, m.timestamp()[1])
                    series.add(bytes(snap.series))  # the worker writes a series one way
            # Late requests (a series' events reach the worker through four input
            # partitions; one running ahead can make another's stragglers late)
            # are in no snapshot's count: the worker's own counter accounts for them.
            if applied_at is not None and counted + late_total >= total:
                done_at = time.perf_counter()
                read_lag_s = time.time() - last_sent_ms / 1000
                cpu_at_done = (cpu_seconds([proc.pid]), cpu_seconds(brokers))
                break
        if done_at is None:
            raise SystemExit(f"worker did not account for all events in time ({counted}/{total})")
        rss = proc_memory(proc.pid)["VmHWM"]
        local, forwarded = worker_paths(log_path)
        # The worker's counters line comes every 0.05 s while its loop is free: wait
        # for one written after the last final snapshot, so that its close time is
        # all there (a checkpoint's writes or the roll-ups after a close may hold
        # the loop for a few seconds on 2 cores).
        seen_close, waited = worker_close_s(log_path), time.monotonic()
        while time.monotonic() - waited < 10.0:
            time.sleep(0.1)  # the log is a file written by another process: poll it
            if worker_close_s(log_path) != seen_close:
                break
        close_s = worker_close_s(log_path)
        checkpoints = worker_checkpoints(log_path)
        stages = worker_stages(log_path)
        sampler.stop()
    finally:
        # py-spy writes its profile on SIGINT; the worker stops cleanly on either.
        proc.send_signal(signal.SIGINT if wrap else signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            print(f"worker did not stop within 60 s; killed (log: {log_path})", flush=True)
            proc.kill()
            proc.wait(10)
        c.close()
        log.close()
    t0 = ready_at or started
    return {
        "seconds": done_at - t0,
        "applied_s": (applied_at or done_at) - t0,
        "close_minute_s": done_at - (closing_at or done_at),
        "read_lag_s": read_lag_s,
        "close_s": close_s,
        "checkpoints": checkpoints,
        "stages_s": stages,
        # CPU seconds from ready to done: the worker process (every thread, librdkafka's
        # included) and the broker, which share this machine's cores.
        "worker_cpu_s": round(cpu_at_done[0] - cpu_at_ready[0], 2),
        "broker_cpu_s": round(cpu_at_done[1] - cpu_at_ready[1], 2),
        "startup_s": t0 - started,
        "peak_rss_mib": round(rss, 1),
        "series_seen": len(series),
        "late": late_total,
        "forwarded_share": round(forwarded / max(local + forwarded, 1), 4),
        "rss_baseline": sampler.baseline or {},
        "rss_peak": sampler.peak,
        "rss_peak_at_s": round(sampler.peak_at_s - (t0 - started), 1),
        "rss_timeline": sampler.timeline,
        "probe": _read_json(data / "probe.json"),
    }


def _read_json(path: Path) -> dict[str, Any]:
    try:
        loaded: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded


def rss_breakdown(w: dict[str, Any], state: dict[str, Any]) -> dict[str, float]:
    """The worker's peak RSS in parts (MiB); see :mod:`bench.memory` for how each is measured."""
    probe = w["probe"]
    peak = w["rss_peak"].get("VmRSS", w["peak_rss_mib"])
    base = w["rss_baseline"].get("VmRSS", 0.0)
    rocks = probe.get("rocksdb", {})
    parts = {
        "process_baseline": base,
        "series_state": state["series_state_mib"],
        "rocksdb_memtables": rocks.get("memtables_mib", 0.0),
        "rocksdb_block_cache": rocks.get("block_cache_mib", 0.0)
        + rocks.get("table_readers_mib", 0.0),
        "stream_buffers": probe.get("stream_buffers", {}).get("value_mib", 0.0),
        "malloc_free_retained": probe.get("malloc_free_mib", 0.0),
    }
    # Digests the snapshots add at the peak: merged closed windows and read views
    # (fastdigest, native memory: counted × the replay's bytes per digest).
    series = probe.get("series", {})
    each = state["parts"]["digest_native_bytes_each"]
    n = series.get("closed_cache_digests", 0) + series.get("digest_views", 0)
    parts["snapshot_digests"] = n * each / 1024**2
    parts["other"] = peak - sum(parts.values())
    return {"peak": round(peak, 1), **{k: round(v, 1) for k, v in parts.items()}}


def measure(
    n_series: int, *, by_series: bool, encoding: str = ENCODING, events: int = EVENTS
) -> dict[str, Any]:
    """A fresh namespace, ``events`` events over ``n_series`` series, one worker."""
    tag = uuid.uuid4().hex[:8]
    prefix = f"bench{tag}."
    create_topics(BROKER, catalogue(PARTITIONS, prefix=prefix))
    msgs, closing = make_placed_workload(
        events, n_series, partitions=PARTITIONS if by_series else None, encoding=encoding
    )
    preload(prefix + "tailguard.inference", msgs)
    w = run_worker(prefix, f"bench-{tag}", events, closing)
    w["events"] = events
    w["events_per_s"] = events / w["seconds"]
    layout = "by series" if by_series else "random"
    print(f"{n_series} series, {layout}, {encoding}: {w['events_per_s']:,.0f} events/s", flush=True)
    return w


def summary(w: dict[str, Any], ceil_eps: float, n_series: int, by_series: bool) -> dict[str, Any]:
    return {
        "series": n_series,
        "partitioned_by_series": by_series,
        "events_per_s": round(w["events_per_s"]),
        "ratio": round(w["events_per_s"] / ceil_eps, 4),
        "forwarded_share": w["forwarded_share"],
        "seconds": round(w["seconds"], 2),
        "close_minute_s": round(w["close_minute_s"], 2),
        "read_lag_s": round(w["read_lag_s"], 3),
        "close_s_in_worker": round(w["close_s"], 2),
        "checkpoints": w["checkpoints"][0],
        "checkpoint_s_in_worker": w["checkpoints"][1],
        "worker_stages_s": w["stages_s"],
        "series_seen": w["series_seen"],
        "late_events": w["late"],
        "peak_rss_mib": w["peak_rss_mib"],
        **cpu_figures(w),
    }


def cpu_figures(w: dict[str, Any]) -> dict[str, float]:
    """CPU spent per event from ready to done: less drift than wall time on a shared
    machine, and it tells the worker's share from the broker's."""
    events = w.get("events", EVENTS)
    return {
        "worker_cpu_us_per_event": round(w["worker_cpu_s"] / events * 1e6, 1),
        "broker_cpu_us_per_event": round(w["broker_cpu_s"] / events * 1e6, 1),
    }


def sustained(ceil_eps: float) -> dict[str, Any] | None:
    """The main case over ``SUSTAINED`` events: each series' open minute fills over
    several checkpoints and provisional snapshots, as it does in production (the
    main run's 600,000 events store each open minute once)."""
    if not SUSTAINED:
        return None
    w = measure(SERIES, by_series=True, events=SUSTAINED)
    return {"events": SUSTAINED, **summary(w, ceil_eps, SERIES, True)}


def main() -> None:
    tag = uuid.uuid4().hex[:8]
    prefix = f"bench{tag}."
    create_topics(BROKER, catalogue(PARTITIONS, prefix=prefix))
    msgs, closing = make_placed_workload(EVENTS, SERIES, encoding=ENCODING)
    topic = prefix + "tailguard.inference"
    t = time.perf_counter()
    preload(topic, msgs)
    print(
        f"preloaded {EVENTS} events in {len(msgs)} messages ({time.perf_counter() - t:.1f}s)",
        flush=True,
    )
    ceil_s, ceil_events = ceiling(topic, len(msgs))
    ceil_eps = ceil_events / ceil_s
    print(f"ceiling: {ceil_eps:,.0f} events/s", flush=True)
    w = run_worker(prefix, f"bench-{tag}", EVENTS, closing)
    eps = EVENTS / w["seconds"]
    print(f"{SERIES} series, by series: {eps:,.0f} events/s", flush=True)
    floor_s = min(close_floor.measure(closing, SERIES) for _ in range(FLOOR_ROUNDS))
    print(f"close floor (broker round trip alone): {floor_s:.2f} s", flush=True)
    at_random = summary(measure(SERIES, by_series=False), ceil_eps, SERIES, False)
    other = "rows" if ENCODING == "columns" else "columns"
    other_encoding = {
        "encoding": other,
        **summary(measure(SERIES, by_series=True, encoding=other), ceil_eps, SERIES, True),
    }
    sweep = []
    for n_series in SWEEP:
        for by_series in (True, False):
            sweep.append(
                summary(measure(n_series, by_series=by_series), ceil_eps, n_series, by_series)
            )
    long_run = sustained(ceil_eps)
    print("replaying the series state in-process (bench.memory)", flush=True)
    state = replay(EVENTS, SERIES, PARTITIONS)
    result = {
        "events": EVENTS,
        "series": SERIES,
        "events_per_message": PER_MESSAGE,
        "partitions": PARTITIONS,
        "all_agents": True,
        "partitioned_by_series": True,
        "events_per_s": round(eps),
        "ceiling_events_per_s": round(ceil_eps),
        "ratio": round(eps / ceil_eps, 4),
        "forwarded_share": w["forwarded_share"],
        "seconds": round(w["seconds"], 2),
        "applied_per_s": round(EVENTS / w["applied_s"]),
        "close_minute_s": round(w["close_minute_s"], 2),
        "read_lag_s": round(w["read_lag_s"], 3),
        "close_floor_s": round(floor_s, 2),
        "close_s_in_worker": round(w["close_s"], 2),
        "checkpoints": w["checkpoints"][0],
        "checkpoint_s_in_worker": w["checkpoints"][1],
        "worker_stages_s": w["stages_s"],
        **cpu_figures(w),
        "series_seen": w["series_seen"],
        "late_events": w["late"],
        "peak_rss_mib": w["peak_rss_mib"],
        "worker_startup_s": round(w["startup_s"], 2),
        "random_partitions": at_random,
        "encoding": ENCODING,
        "other_encoding": other_encoding,
        "rss_breakdown_mib": rss_breakdown(w, state),
        "memory_env": {
            k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "TAILGUARD_ROCKSDB"))
        },
        "rss_at_peak_mib": w["rss_peak"],
        "rss_peak_after_ready_s": w["rss_peak_at_s"],
        "rss_timeline_s_mib": w["rss_timeline"],
        "memory_probe_at_peak": w["probe"],
        "series_sweep": sweep,
        "sustained": long_run,
        "series_state": state,
        "bytes_per_series": state["bytes_per_series"],
        "event_time": f"{PER_MS * 1000} requests/s, then one closing request per series",
        "machine": machine("broker, benchmark and worker share the machine"),
        "command": "make bench",
    }
    write_result("throughput", result)
    print(json.dumps(result, indent=2), flush=True)


if __name__ == "__main__":
    run(main)
