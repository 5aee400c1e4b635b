"""The floor under ``close_minute_s``: the broker's round trip of a minute's close,
with no work in between, on this machine.

    python -m bench.close_floor           (the throughput benchmark runs it too)

The throughput benchmark times the close of 10,000 series' minute from the
closing requests' delivery to the broker to the last final 1-minute snapshot
read back. Part of that is not the worker's work at all: the broker takes the
closing requests and the 30,000 snapshot records (1m, 5m and 1h of every
series), a consumer reads them back, all on the same cores. This measures that
part alone. A bare process stands in for the worker: it consumes the closing
requests (decoding each message, typed, as the ceiling does) and, once all
have come, produces the records a close publishes — every series' final 1m,
5m and 1h snapshots, encoded beforehand, with their CloudEvents headers, by a
producer configured as the worker's outputs are — while this process reads the
1-minute ones back as the throughput benchmark's reader does. What remains of
``close_minute_s`` above this floor is the worker's.
"""

import os
import subprocess
import sys
import time
import uuid
from typing import Any

import msgspec
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from tailguard.schemas import ce_headers
from tailguard.schemas.columnar import InferenceColumns

from bench.kafka_io import BROKER, READ_WAIT_S, preload, read_snapshot
from bench.workload import PARTITIONS, Placed, make_placed_workload

SERIES = int(os.environ.get("BENCH_SERIES", "10000"))
WINDOWS = (("1m", 60), ("5m", 300), ("1h", 3600))


def _row(base: float) -> dict[str, float | int]:
    return {
        "count": 57,
        "p50": base,
        "p90": base * 2.03,
        "p95": base * 2.37,
        "p99": base * 3.18,
        "p999": base * 3.5031,
    }


def snapshot_records(n_series: int, end_ms: int) -> list[tuple[bytes, bytes, list[Any]]]:
    """``(key, value, headers)`` of every series' final 1m, 5m and 1h snapshots:
    the fields, sizes (~1.1 KB) and headers the worker's close publishes."""
    encode = msgspec.json.Encoder().encode
    out = []
    for s in range(n_series):
        series = {
            "service": f"svc{s % 10}",
            "model": f"m{s % 13}",
            "variant": "control",
            "tenant": f"t{s}",
        }
        key = "|".join(series.values()).encode()
        for window, seconds in WINDOWS:
            event_id = uuid.uuid4().hex
            payload = {
                "schema": "tailguard.sli.v1",
                "event_id": event_id,
                "ts_ms": end_ms + 2_000,
                "series": series,
                "window": window,
                "window_s": seconds,
                "window_end_ms": end_ms,
                "final": True,
                "count": 57,
                "errors": 0,
                "cancelled": 0,
                "success_rate": 1.0,
                "ttft_compliance": 0.9824561403508771,
                "itl_compliance": 0.9961013645224172,
                "slo_compliance": 0.9865497076023392,
                "goodput_rps": 56 / seconds,
                "late": 0,
                "duplicates": 0,
                "exemplars": [f"{s:032x}"] * 5,
                "ttft_ms": _row(168.53 + s % 7),
                "tpot_ms": _row(32.333333333333336),
                "itl_ms": _row(29.73),
                "e2e_ms": _row(463.41 + s % 11),
                "stages_ms": {},
            }
            headers = ce_headers("tailguard.sli.v1", event_id, end_ms + 2_000)
            out.append((key, encode(payload), headers))
    return out


def stand_in(in_topic: str, out_topic: str, n_msgs: int, n_series: int) -> None:
    """The worker's place: read ``n_msgs`` closing messages, then publish the close."""
    records = snapshot_records(n_series, 1_800_000_000_000)
    decode = msgspec.json.Decoder(InferenceColumns).decode
    c = Consumer(
        {
            "bootstrap.servers": BROKER,
            "group.id": f"floor-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(in_topic, p, 0) for p in range(PARTITIONS)])
    p = Producer(
        {
            "bootstrap.servers": BROKER,
            "linger.ms": 20,
            "compression.type": "lz4",
            "enable.idempotence": True,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    print("ready", flush=True)
    seen = 0
    while seen < n_msgs:
        for m in c.consume(1000, timeout=0.02):
            if not m.error():
                decode(m.value() or b"")
                seen += 1
    for key, value, headers in records:
        while True:
            try:
                p.produce(out_topic, value=value, key=key, headers=headers)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    c.close()


def measure(closing: Placed, n_series: int) -> float:
    """Seconds from the closing messages on the broker to the last 1-minute snapshot
    read back, with a bare process in the worker's place."""
    prefix = f"floor{uuid.uuid4().hex[:8]}."
    in_topic, out_topic = prefix + "closing", prefix + "sli"
    admin = AdminClient({"bootstrap.servers": BROKER})
    made = admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in (in_topic, out_topic)])
    for future in made.values():
        future.result(30)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.close_floor",
            "--stand-in",
            in_topic,
            out_topic,
            str(len(closing)),
            str(n_series),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    reader = Consumer(
        {
            "bootstrap.servers": BROKER,
            "group.id": f"floor-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        reader.assign([TopicPartition(out_topic, p, 0) for p in range(PARTITIONS)])
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        preload(in_topic, closing)
        closing_at = time.perf_counter()
        read = 0
        deadline = time.monotonic() + 120
        while read < n_series and time.monotonic() < deadline:
            for m in reader.consume(5000, timeout=READ_WAIT_S):
                if not m.error() and read_snapshot(m.value() or b"").window == "1m":
                    read += 1
        if read < n_series:
            raise SystemExit(f"close floor: {read}/{n_series} snapshots read back in time")
        return time.perf_counter() - closing_at
    finally:
        reader.close()
        proc.wait(60)


def main() -> None:
    _, closing = make_placed_workload(SERIES * 60, SERIES, encoding="columns")
    rounds = [measure(closing, SERIES) for _ in range(3)]
    print({"close_floor_s": [round(r, 3) for r in rounds], "series": SERIES}, flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--stand-in":
        stand_in(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
