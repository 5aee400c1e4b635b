"""Burst benchmark: a 10× burst for 60 s against one worker; peak lag and drain time.

    python -m bench.burst                 (make bench runs it after the throughput run)

A producer sends inference events in real time (event time = wall-clock time)
at ``BURST_BASE`` events/s (default 1,500, over 2,000 series: 100 deployments
— service × model, what the capacity agent tracks — of 20 tenants each, laid out
as in the throughput benchmark), then at ten
times that for ``BURST_S`` seconds (default 60), then at the base rate again.
Every half second the benchmark reads, for the worker's consumer group, the
lag (end offset − committed offset) of the input topic and of the internal
per-series topic, plus the worker's own counters (``applied``).

Reported (``bench/results/burst.json``):

- ``peak_lag_events``: the most events produced but not yet folded into the
  windows (produced − applied) — the backlog an operator would see;
- ``peak_lag``: the largest committed-offset lag of the input topic in
  messages, and of the internal topic;
- ``drain_s``: from the end of the burst until the backlog is back under
  twice the base rate (two seconds of normal traffic).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench.common import machine, run, worker_counters, write_result
from bench.workload import series_fields
from tailguard.catalogue import catalogue
from tailguard.kafka_admin import create_topics

BROKER = os.environ.get("TAILGUARD_BROKER", "127.0.0.1:19092")
BASE = int(os.environ.get("BURST_BASE", "1500"))
FACTOR = 10
BURST_S = float(os.environ.get("BURST_S", "60"))
BEFORE_S = 20.0
AFTER_MAX_S = float(os.environ.get("BURST_AFTER_MAX_S", "600"))
SERIES = 2_000
#: ``tenants`` (default): the throughput benchmark's layout, 100 deployments of 20
#: tenants; ``deployments``: every series its own deployment (2,000 deployments),
#: the capacity agent's worst case.
LAYOUT = os.environ.get("BURST_LAYOUT", "tenants")
if LAYOUT not in ("tenants", "deployments"):
    raise SystemExit(f"BURST_LAYOUT must be tenants or deployments, got {LAYOUT!r}")
NAME = os.environ.get("BURST_NAME", "burst")
PER_MESSAGE = 100
PARTITIONS = 4


def _fields(s: int) -> dict[str, str]:
    """The service, model, tenant and variant of series ``s`` in the chosen layout."""
    if LAYOUT == "deployments":
        return {
            "service": f"svc{s % 100}",
            "model": f"m{s // 100}",
            "tenant": "t0",
            "variant": "control" if s < SERIES // 2 else "treatment",
        }
    return series_fields(s, SERIES)


def _committed_lag(admin: AdminClient, marks: Consumer, group: str, topic: str) -> int:
    """End offsets − committed offsets of ``group`` on ``topic`` (messages)."""
    parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    try:
        res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, parts)])
        committed = {
            tp.partition: max(tp.offset, 0) for tp in res[group].result(timeout=5).topic_partitions
        }
    except Exception:
        committed = {}
    ends = {
        p: marks.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
        for p in range(PARTITIONS)
    }
    return sum(max(ends[p] - committed.get(p, 0), 0) for p in range(PARTITIONS))


def main() -> None:
    tag = uuid.uuid4().hex[:8]
    layout = [_fields(s) for s in range(SERIES)]
    prefix = f"burst{tag}."
    app_id = f"burst-{tag}"
    create_topics(BROKER, catalogue(PARTITIONS, prefix=prefix))
    topic = prefix + "tailguard.inference"
    internal = prefix + "tailguard.internal.series"
    data = Path(tempfile.mkdtemp(prefix="tg-burst-"))
    log_path = data / "worker.log"
    env = {
        **os.environ,
        "TAILGUARD_BROKER": BROKER,
        "TAILGUARD_TOPIC_PREFIX": prefix,
        "TAILGUARD_APP_ID": app_id,
        "TAILGUARD_PARTITIONS": str(PARTITIONS),
        "TAILGUARD_STATS_INTERVAL_S": "0.5",
    }
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tailguard.cli",
                "worker",
                "--data-dir",
                str(data / "state"),
                "--loglevel",
                "info",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    admin = AdminClient({"bootstrap.servers": BROKER})
    marks = Consumer({"bootstrap.servers": BROKER, "group.id": f"lag-{uuid.uuid4().hex}"})
    producer = Producer({"bootstrap.servers": BROKER, "linger.ms": 20, "compression.type": "lz4"})
    enc = msgspec.json.Encoder()
    rng = np.random.default_rng(7)
    produced = 0
    samples: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 120
        while b"Ready" not in log_path.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"worker did not start; see {log_path}")
            time.sleep(0.2)
        t0 = time.monotonic()
        burst_from, burst_to = BEFORE_S, BEFORE_S + BURST_S
        next_sample = 0.0
        drained_at = None
        while True:
            now = time.monotonic() - t0
            rate = BASE * FACTOR if burst_from <= now < burst_to else BASE
            # Produce what the schedule owes up to now, in messages of PER_MESSAGE.
            owed = int(
                BASE * min(now, burst_from)
                + BASE * FACTOR * max(0.0, min(now, burst_to) - burst_from)
                + BASE * max(0.0, now - burst_to)
            )
            while produced + PER_MESSAGE <= owed:
                ts = int(time.time() * 1000)
                sid = rng.integers(0, SERIES, PER_MESSAGE)
                ttft = rng.lognormal(np.log(180), 0.45, PER_MESSAGE)
                batch = [
                    {
                        "event_id": f"{tag}-{produced + i}",
                        "ts_ms": ts,
                        **layout[int(s)],
                        "status": "ok",
                        "ttft_ms": round(float(t), 2),
                        "e2e_ms": round(float(t) + 400.0, 2),
                        "output_tokens": 10,
                        "itl_ms": [40.0] * 9,
                    }
                    for i, (s, t) in enumerate(zip(sid, ttft, strict=True))
                ]
                producer.produce(topic, enc.encode(batch), key=str(produced).encode())
                produced += PER_MESSAGE
            producer.poll(0)
            if now >= next_sample:
                next_sample = now + 0.5
                applied = sum(worker_counters(log_path))
                sample = {
                    "t": round(now, 2),
                    "rate": rate,
                    "produced": produced,
                    "applied": applied,
                    "backlog": max(produced - applied, 0),
                    "input_lag": _committed_lag(admin, marks, app_id, topic),
                    "internal_lag": _committed_lag(admin, marks, app_id, internal),
                }
                samples.append(sample)
                if now > burst_to and sample["backlog"] <= 2 * BASE:
                    drained_at = now
                    break
                if now > burst_to + AFTER_MAX_S:
                    break
            if proc.poll() is not None:
                raise SystemExit(f"worker exited with {proc.returncode}; see {log_path}")
            time.sleep(0.02)
        producer.flush(30)
    finally:
        proc.terminate()
        proc.wait(60)
        marks.close()
    result = {
        "layout": LAYOUT,
        "base_events_per_s": BASE,
        "burst_events_per_s": BASE * FACTOR,
        "burst_s": BURST_S,
        "series": SERIES,
        "deployments": len({(f["service"], f["model"]) for f in layout}),
        "peak_lag": {
            "input_messages": max(s["input_lag"] for s in samples),
            "internal_messages": max(s["internal_lag"] for s in samples),
        },
        "peak_lag_events": max(s["backlog"] for s in samples),
        "drain_s": None if drained_at is None else round(drained_at - burst_to, 1),
        "drained": drained_at is not None,
        "samples": samples[::4],
        "machine": machine("broker, producer and worker share the machine"),
        "command": "make bench"
        if LAYOUT == "tenants" and NAME == "burst"
        else (f"BURST_LAYOUT={LAYOUT} BURST_NAME={NAME} python -m bench.burst"),
    }
    write_result(NAME, result)
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=2), flush=True)


if __name__ == "__main__":
    run(main)
