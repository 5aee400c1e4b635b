"""Input placed by series is folded where it arrives; any other placement is forwarded.

The same events go to two fresh namespaces: once keyed by series (each message
holds series of one home partition and carries one of their keys, so
librdkafka's default partitioner puts it on that partition), once keyed at
random (every series spread over both partitions). The worker must fold the
first without the forward hop, forward the second, and publish the same
windows for both.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from tailguard.schemas.columnar import encode_columns
from tailguard.schemas.placement import by_home_partition, home_partition, series_key_of

pytestmark = pytest.mark.integration

SERVICES = ("svc-a", "svc-b", "svc-c", "svc-d")
TENANTS = ("t1", "t2")
PER_SERIES = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_events(start_ms: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(11)
    events = []
    for i in range(PER_SERIES):
        for svc in SERVICES:
            for tenant in TENANTS:
                ttft = round(float(rng.lognormal(np.log(200), 0.4)), 3)
                events.append(
                    {
                        "event_id": f"{svc}-{tenant}-{i}",
                        "ts_ms": start_ms + i * 400,
                        "service": svc,
                        "model": "m1",
                        "tenant": tenant,
                        "status": "ok",
                        "ttft_ms": ttft,
                        "e2e_ms": ttft + 300.0,
                        "output_tokens": 5,
                        "itl_ms": [70.0, 80.0, 75.0, 72.0],
                    }
                )
    return events


def placed(events: list[dict[str, Any]], partitions: int) -> list[tuple[bytes, bytes]]:
    """Columnar messages of up to 100 events, each of one home partition, keyed by a
    series of it (as the project's producers send them)."""
    out = []
    for lo in range(0, len(events), 100):
        for key, group in by_home_partition(events[lo : lo + 100], partitions).values():
            out.append((key.encode(), encode_columns(group)))
    return out


def scattered(events: list[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
    """Rows (JSON arrays of 100 events) on arbitrary partitions."""
    return [
        (str(i % 7).encode(), json.dumps(events[lo : lo + 100]).encode())
        for i, lo in enumerate(range(0, len(events), 100))
    ]


def counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def run_worker(
    ns: Any,
    messages: list[tuple[bytes, bytes]],
    worker_factory: Callable[..., Any],
    collector: Callable[..., Any],
    produce: Callable[..., Any],
    total: int,
) -> tuple[dict[str, dict[str, Any]], tuple[float, float, float], list[tuple[int, int]]]:
    """Latest 1 h snapshot per series once all are counted, and the events folded
    where they came in, the events forwarded, the columnar messages read."""
    positions = produce(ns.broker, ns.topic("tailguard.inference"), messages)
    port = free_port()
    worker = worker_factory(ns.prefix, "--web-port", str(port), ns=ns).start()
    sli = collector("tailguard.sli", ns=ns)

    def latest(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        best: dict[str, dict[str, Any]] = {}
        for r in records:
            if r["window"] != "1h":
                continue
            key = series_key_of(r["series"])
            if key not in best or r["count"] >= best[key]["count"]:
                best[key] = r
        return best

    def complete(records: list[dict[str, Any]]) -> bool:
        found = latest(records)
        return len(found) == len(SERVICES) * len(TENANTS) and all(
            s["count"] == PER_SERIES for s in found.values()
        )

    sli.wait_for(complete, timeout=180, worker=worker)
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        local = counter(text, "tailguard_events_local_total")
        forwarded = counter(text, "tailguard_events_forwarded_total")
        columnar = counter(text, "tailguard_input_messages_columnar_total")
        capacity = counter(text, "tailguard_capacity_requests_in_place_total") + counter(
            text, "tailguard_capacity_requests_forwarded_total"
        )
        if (local + forwarded >= total and capacity >= total) or time.monotonic() > deadline:
            break
        time.sleep(0.5)  # /metrics of another process: polled until its counters arrive
    worker.stop()
    # The ingest's time by stage is on /metrics too: every stage ran.
    for stage in ("decode", "dispatch", "fold"):
        assert counter(text, f"tailguard_ingest_{stage}_seconds_total") > 0, stage
    # One worker owns every capacity partition: each request is applied where it
    # is read, none takes the internal capacity topic.
    assert counter(text, "tailguard_capacity_requests_in_place_total") == total
    assert counter(text, "tailguard_capacity_requests_forwarded_total") == 0
    return latest(sli.records), (local, forwarded, columnar), positions


def test_placed_input_is_folded_in_place_and_judged_like_forwarded_input(
    namespace: Any,
    second_namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[..., Any],
    produce: Callable[..., Any],
) -> None:
    events = make_events(int(time.time() * 1000) - 600_000)
    homes = {home_partition(series_key_of(e), namespace.partitions) for e in events}
    assert homes == set(range(namespace.partitions)), "the series must live on every partition"

    messages = placed(events, namespace.partitions)
    here, (local, forwarded, columnar), positions = run_worker(
        namespace, messages, worker_factory, collector, produce, len(events)
    )
    assert (local, forwarded) == (len(events), 0)
    assert columnar == len(messages)
    # librdkafka's default partitioner put every message on its series' home.
    assert {p for p, _ in positions} == homes

    # Rows, scattered: the same snapshots (the two forms are read alike).
    away, (local2, forwarded2, columnar2), _ = run_worker(
        second_namespace, scattered(events), worker_factory, collector, produce, len(events)
    )
    assert local2 + forwarded2 == len(events) and forwarded2 > len(events) / 2
    assert columnar2 == 0

    assert here.keys() == away.keys()
    for key, snap in here.items():
        other = away[key]
        assert snap["count"] == other["count"] == PER_SERIES
        assert snap["late"] == other["late"] == 0
        for metric in ("ttft_ms", "e2e_ms", "itl_ms"):
            assert snap[metric]["count"] == other[metric]["count"]
            for q in ("p50", "p95", "p99"):
                assert snap[metric][q] == pytest.approx(other[metric][q], rel=0.01), (key, metric)
