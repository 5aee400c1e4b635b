"""Throughput benchmark through the real broker: one worker vs a bare consumer.

    python -m bench.throughput            (make bench starts the test broker first)

1. Pre-loads ``BENCH_EVENTS`` inference events (default 200,000; ~310 bytes
   each with 9 ITL gaps, 200 per message, over ``BENCH_SERIES`` = 1,000
   series) into a fresh topic namespace.
2. *Ceiling*: a bare confluent-kafka consumer reads the same topic and decodes
   every message with msgspec into typed events — the most any Python consumer
   of this topic could do on this machine, measured in the same run.
3. *Worker*: one ``tailguard worker`` subprocess consumes the topic; the clock
   runs from its first committed offset (start-up excluded, reported apart) to
   the moment the SLI snapshots account for every event.

Writes ``bench/results/throughput.json``. Absolute numbers drift on shared
machines; the ratio to the ceiling is the figure to compare across runs.
"""

import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from tailguard.schemas import InferenceEvent

from tailguard.catalogue import catalogue
from tailguard.kafka_admin import create_topics

REPO = Path(__file__).resolve().parents[1]
BROKER = os.environ.get("TAILGUARD_BROKER", "127.0.0.1:19092")
EVENTS = int(os.environ.get("BENCH_EVENTS", "200000"))
SERIES = int(os.environ.get("BENCH_SERIES", "1000"))
PER_MESSAGE = 200
PARTITIONS = 4


def make_messages(n: int, series: int, seed: int = 1) -> list[bytes]:
    rng = np.random.default_rng(seed)
    start = int(time.time() * 1000) - 1_800_000
    ttft = rng.lognormal(np.log(180), 0.45, n)
    gaps = rng.lognormal(np.log(30), 0.35, (n, 9)).round(2)
    sid = rng.integers(0, series, n)
    enc = msgspec.json.Encoder()
    msgs = []
    for lo in range(0, n, PER_MESSAGE):
        batch = []
        for i in range(lo, min(n, lo + PER_MESSAGE)):
            s = int(sid[i])
            itl = gaps[i].tolist()
            batch.append(
                {
                    "event_id": f"b{i}",
                    "ts_ms": start + i * 1_500_000 // n,
                    "service": f"svc{s % 10}",
                    "model": f"m{(s // 10) % 10}",
                    "tenant": f"t{(s // 100) % 5}",
                    "variant": "control" if s < series // 2 else "treatment",
                    "status": "ok",
                    "ttft_ms": round(float(ttft[i]), 2),
                    "e2e_ms": round(float(ttft[i]) + sum(itl), 2),
                    "output_tokens": 10,
                    "input_tokens": 300,
                    "itl_ms": itl,
                }
            )
        msgs.append(enc.encode(batch))
    return msgs


def preload(topic: str, msgs: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": BROKER, "linger.ms": 20, "compression.type": "lz4"})
    for i, m in enumerate(msgs):
        while True:
            try:
                p.produce(topic, m, key=str(i % 64).encode())
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0


def ceiling(topic: str, n_msgs: int) -> tuple[float, int]:
    """Bare consume + typed decode of every message; returns (seconds, events)."""
    dec = msgspec.json.Decoder(list[InferenceEvent])
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
            events += len(dec.decode(m.value()))
            seen += 1
    elapsed = time.perf_counter() - (t0 or time.perf_counter())
    c.close()
    return elapsed, events


def group_committed(admin: AdminClient, group: str, topic: str) -> int:
    from confluent_kafka import ConsumerGroupTopicPartitions

    fut = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(PARTITIONS)])]
    )
    try:
        res = fut[group].result(timeout=5)
    except Exception:
        return 0
    return sum(max(tp.offset, 0) for tp in res.topic_partitions)


def run_worker(prefix: str, app_id: str, total: int) -> dict[str, Any]:
    topic = prefix + "tailguard.inference"
    sli_topic = prefix + "tailguard.sli"
    data = Path(tempfile.mkdtemp(prefix="tg-bench-"))
    env = {
        **os.environ,
        "TAILGUARD_BROKER": BROKER,
        "TAILGUARD_TOPIC_PREFIX": prefix,
        "TAILGUARD_APP_ID": app_id,
        "TAILGUARD_PARTITIONS": str(PARTITIONS),
    }
    log = open(data / "worker.log", "wb")  # noqa: SIM115 - closed below
    started = time.perf_counter()
    # BENCH_PROFILE=path.svg records the worker with py-spy (pip install py-spy).
    wrap = ["py-spy", "record", "-f", "raw", "-o", os.environ["BENCH_PROFILE"], "--"] if os.environ.get("BENCH_PROFILE") else []
    proc = subprocess.Popen(
        [
            *wrap,
            sys.executable,
            "-m",
            "tailguard.cli",
            "worker",
            "--data-dir",
            str(data / "state"),
            "--snapshot-interval",
            "1",
            "--windows",
            "1h",
            "--loglevel",
            "warning",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    admin = AdminClient({"bootstrap.servers": BROKER})
    c = Consumer(
        {
            "bootstrap.servers": BROKER,
            "group.id": f"sli-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    first_commit = None
    latest: dict[str, int] = {}
    deadline = time.monotonic() + 900
    done_at = None
    assigned = False
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"worker exited with {proc.returncode}; see {data / 'worker.log'}")
            if first_commit is None and group_committed(admin, app_id, topic) > 0:
                first_commit = time.perf_counter()
            if not assigned:
                md = admin.list_topics(sli_topic, timeout=5).topics[sli_topic]
                c.assign([TopicPartition(sli_topic, p, 0) for p in md.partitions])
                assigned = True
            for m in c.consume(5000, timeout=0.2):
                if m.error():
                    continue
                snap = json.loads(m.value())
                key = json.dumps(snap["series"], sort_keys=True)
                latest[key] = max(latest.get(key, 0), snap["count"])
            if sum(latest.values()) >= total:
                done_at = time.perf_counter()
                break
        if done_at is None:
            raise SystemExit(
                f"worker did not account for all events in time ({sum(latest.values())}/{total})"
            )
        rss = 0.0
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                rss = int(line.split()[1]) / 1024
    finally:
        # py-spy writes its profile on SIGINT; the worker stops cleanly on either.
        proc.send_signal(signal.SIGINT if wrap else signal.SIGTERM)
        proc.wait(60)
        c.close()
        log.close()
    t0 = first_commit or started
    return {
        "seconds": done_at - t0,
        "startup_s": t0 - started,
        "peak_rss_mib": round(rss, 1),
        "series_seen": len(latest),
    }


def main() -> None:
    tag = uuid.uuid4().hex[:8]
    prefix = f"bench{tag}."
    create_topics(BROKER, catalogue(PARTITIONS, prefix=prefix))
    msgs = make_messages(EVENTS, SERIES)
    topic = prefix + "tailguard.inference"
    t = time.perf_counter()
    preload(topic, msgs)
    print(f"preloaded {EVENTS} events in {len(msgs)} messages ({time.perf_counter() - t:.1f}s)")
    ceil_s, ceil_events = ceiling(topic, len(msgs))
    print(f"ceiling: {ceil_events / ceil_s:,.0f} events/s")
    w = run_worker(prefix, f"bench-{tag}", EVENTS)
    eps = EVENTS / w["seconds"]
    result = {
        "events": EVENTS,
        "series": SERIES,
        "events_per_message": PER_MESSAGE,
        "partitions": PARTITIONS,
        "events_per_s": round(eps),
        "ceiling_events_per_s": round(ceil_events / ceil_s),
        "ratio": round(eps / (ceil_events / ceil_s), 4),
        "peak_rss_mib": w["peak_rss_mib"],
        "worker_startup_s": round(w["startup_s"], 2),
        "series_seen": w["series_seen"],
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "command": "make bench",
    }
    out = REPO / "bench" / "results" / "throughput.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
