"""End to end on the real broker: inference events in, SLI snapshots and dead letters out."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.integration

PCTS = {"p50": 50, "p90": 90, "p95": 95, "p99": 99, "p999": 99.9}


def make_events(
    service: str, n: int, rng: np.random.Generator, start_ms: int, span_ms: int = 180_000
) -> list[dict[str, Any]]:
    """Inference events with known TTFT/E2E/ITL values spread over ``span_ms``."""
    ttft = rng.lognormal(np.log(180), 0.45, n)
    gaps = rng.lognormal(np.log(30), 0.35, (n, 9))
    events = []
    for i in range(n):
        itl = [round(float(g), 3) for g in gaps[i]]
        t = round(float(ttft[i]), 3)
        events.append(
            {
                "event_id": f"{service}-{i}",
                "ts_ms": start_ms + int(i * span_ms / n),
                "service": service,
                "model": "m1",
                "status": "ok",
                "ttft_ms": t,
                "e2e_ms": round(t + sum(itl) + 1.0, 3),
                "output_tokens": 10,
                "input_tokens": 100,
                "itl_ms": itl,
                "trace_id": uuid.UUID(int=int(rng.integers(1, 2**63))).hex,
            }
        )
    return events


def batches(events: list[dict[str, Any]], size: int) -> list[tuple[bytes, bytes]]:
    return [
        (f"{events[i]['service']}/{i % 7}".encode(), json.dumps(events[i : i + size]).encode())
        for i in range(0, len(events), size)
    ]


def latest_1h(records: list[dict[str, Any]], service: str) -> dict[str, Any] | None:
    best = None
    for r in records:
        if r.get("window") != "1h" or r["series"]["service"] != service:
            continue
        if best is None or (r["window_end_ms"], r["count"]) >= (
            best["window_end_ms"],
            best["count"],
        ):
            best = r
    return best


def test_snapshots_match_exact_percentiles_and_counts(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[[str], Any],
    produce: Callable[..., list[tuple[int, int]]],
) -> None:
    rng = np.random.default_rng(7)
    start = int(time.time() * 1000) - 600_000
    per_series = {"svc-a": 20_000, "svc-b": 17_000, "svc-c": 13_000}
    all_events = {s: make_events(s, n, rng, start) for s, n in per_series.items()}
    messages = [m for s in per_series for m in batches(all_events[s], 200)]
    positions = produce(namespace.broker, namespace.topic("tailguard.inference"), messages)
    assert len({p for p, _ in positions}) >= 2, "events must span at least two partitions"

    worker = worker_factory("w1").start()
    sli = collector("tailguard.sli")

    def complete(records: list[dict[str, Any]]) -> bool:
        return all(
            (s := latest_1h(records, svc)) is not None and s["count"] == n
            for svc, n in per_series.items()
        )

    sli.wait_for(complete, timeout=180, worker=worker)
    for svc, n in per_series.items():
        snap = latest_1h(sli.records, svc)
        assert snap is not None
        assert snap["count"] == n and snap["errors"] == 0
        ttft = np.array([e["ttft_ms"] for e in all_events[svc]])
        e2e = np.array([e["e2e_ms"] for e in all_events[svc]])
        itl = np.array([g for e in all_events[svc] for g in e["itl_ms"]])
        for metric, values in (("ttft_ms", ttft), ("e2e_ms", e2e), ("itl_ms", itl)):
            assert snap[metric]["count"] == len(values)
            for name, q in PCTS.items():
                exact = float(np.percentile(values, q))
                assert snap[metric][name] == pytest.approx(exact, rel=0.01), (svc, metric, name)
    headers = dict(sli.headers[-1])
    assert headers["ce_specversion"] == b"1.0"
    assert headers["ce_type"] == b"tailguard.sli.v1"
    assert headers["content-type"] == b"application/json"


def malformed_messages(rng: np.random.Generator, now_ms: int) -> list[tuple[str, bytes]]:
    """500 bad messages of 12 kinds, each with the reason it must be dead-lettered for."""
    good = {
        "event_id": "x",
        "ts_ms": now_ms - 1000,
        "service": "bad",
        "model": "m",
        "status": "ok",
        "e2e_ms": 100.0,
        "ttft_ms": 50.0,
        "output_tokens": 3,
        "itl_ms": [10.0, 12.0],
    }

    def variant(**changes: Any) -> bytes:
        ev = {**good, "event_id": uuid.uuid4().hex, **changes}
        return json.dumps({k: v for k, v in ev.items() if v is not ...}).encode()

    kinds: list[Callable[[], tuple[str, bytes]]] = [
        lambda: ("malformed_json", b'{"event_id": "x", "ts_ms": '),
        lambda: ("not_utf8", b'{"event_id": "\xff\xfe"}'),
        lambda: ("missing_field", variant(service=...)),
        lambda: ("wrong_type", variant(e2e_ms="slow")),
        lambda: ("negative_duration", variant(ttft_ms=-5.0)),
        lambda: ("nan_or_infinite", variant(e2e_ms=float("nan"))),
        lambda: ("absurd_value", variant(ttft_ms=4_000_000.0, e2e_ms=4_100_000.0)),
        lambda: ("future_timestamp", variant(ts_ms=now_ms + 86_400_000)),
        lambda: ("unknown_schema_version", variant(schema="tailguard.inference.v9")),
        lambda: ("not_an_object", b"[1, 2, 3]"),
        lambda: ("too_deep", b"[" * 64 + b"]" * 64),
        lambda: ("inconsistent", variant(ttft_ms=...)),
    ]
    return [kinds[i % len(kinds)]() for i in range(500)]


def test_malformed_input_is_dead_lettered_and_valid_events_still_count(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[[str], Any],
    produce: Callable[..., list[tuple[int, int]]],
) -> None:
    rng = np.random.default_rng(11)
    now = int(time.time() * 1000)
    # Within one minute: however the input partitions interleave, no bucket can close
    # (that needs the watermark 2 min past a bucket's end), so no valid event is late.
    valid = make_events("svc-valid", 3_000, rng, now - 600_000, span_ms=55_000)
    good_msgs = batches(valid, 50)
    bad = malformed_messages(rng, now)
    messages: list[tuple[bytes | None, bytes]] = []
    for i, (_reason, raw) in enumerate(bad):
        messages.append((b"bad", raw))
        if i < len(good_msgs):
            messages.append(good_msgs[i])
    # lz4, as the simulator and many producers send it: the worker must read any codec.
    positions = produce(namespace.broker, namespace.topic("tailguard.inference"), messages, "lz4")
    bad_positions = {positions[i] for i, (key, _) in enumerate(messages) if key == b"bad"}
    expected_reason = {}
    j = 0
    for i, (key, _) in enumerate(messages):
        if key == b"bad":
            expected_reason[positions[i]] = bad[j][0]
            j += 1

    worker = worker_factory("w1").start()
    dead = collector("tailguard.deadletter")
    sli = collector("tailguard.sli")
    dead.wait_for(
        lambda r: {(x["partition"], x["offset"]) for x in r} >= bad_positions,
        timeout=180,
        worker=worker,
    )
    sli.wait_for(
        lambda r: (s := latest_1h(r, "svc-valid")) is not None and s["count"] == len(valid),
        timeout=120,
        worker=worker,
    )
    assert worker.alive()
    by_position = {(r["partition"], r["offset"]): r for r in dead.records}
    assert set(by_position) == bad_positions
    for pos, reason in expected_reason.items():
        assert by_position[pos]["reason"] == reason, (pos, by_position[pos])
        assert by_position[pos]["detail"]
    assert len({r["reason"] for r in dead.records}) >= 10


def test_worker_killed_mid_stream_resumes_with_exact_counts(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[[str], Any],
    produce: Callable[..., list[tuple[int, int]]],
) -> None:
    rng = np.random.default_rng(3)
    start = int(time.time() * 1000) - 900_000
    events = make_events("svc-kill", 60_000, rng, start)
    produce(namespace.broker, namespace.topic("tailguard.inference"), batches(events, 100))
    worker = worker_factory("w1").start()
    sli = collector("tailguard.sli")
    sli.wait_for(
        lambda r: (s := latest_1h(r, "svc-kill")) is not None and s["count"] > 0,
        timeout=120,
        worker=worker,
    )
    worker.kill()
    worker.start()
    sli.wait_for(
        lambda r: (s := latest_1h(r, "svc-kill")) is not None and s["count"] >= len(events),
        timeout=180,
        worker=worker,
    )
    time.sleep(3)
    sli.poll(2)
    snap = latest_1h(sli.records, "svc-kill")
    assert snap is not None
    assert snap["count"] == len(events)
    assert snap["duplicates"] == 0
    ttft = np.array([e["ttft_ms"] for e in events])
    assert snap["ttft_ms"]["p99"] == pytest.approx(float(np.percentile(ttft, 99)), rel=0.01)


def test_columnar_messages_are_folded_and_their_bad_requests_dead_lettered_alone(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[[str], Any],
    produce: Callable[..., list[tuple[int, int]]],
) -> None:
    from tests.unit.schemas.test_columnar import columns_doc

    rng = np.random.default_rng(5)
    now = int(time.time() * 1000)
    valid = make_events("svc-col", 2_000, rng, now - 600_000, span_ms=55_000)
    bad_kinds = [
        ("negative_duration", {"ttft_ms": -5.0}),
        ("future_timestamp", {"ts_ms": now + 86_400_000}),
        ("inconsistent", {"ttft_ms": 900.0, "e2e_ms": 800.0}),
    ]
    messages: list[tuple[bytes, bytes]] = []
    expected: list[tuple[str, str]] = []  # (event id, reason) of every bad request
    for m, lo in enumerate(range(0, len(valid), 100)):
        rows = list(valid[lo : lo + 100])
        reason, change = bad_kinds[m % len(bad_kinds)]
        bad = {**rows[0], **change, "event_id": f"bad-{m}"}
        rows.insert(m % len(rows), bad)
        expected.append((bad["event_id"], reason))
        messages.append((b"svc-col", json.dumps(columns_doc(rows)).encode()))
    positions = produce(namespace.broker, namespace.topic("tailguard.inference"), messages)
    worker = worker_factory("w1").start()
    dead = collector("tailguard.deadletter")
    sli = collector("tailguard.sli")
    dead.wait_for(lambda r: len(r) >= len(expected), timeout=180, worker=worker)
    sli.wait_for(
        lambda r: (s := latest_1h(r, "svc-col")) is not None and s["count"] == len(valid),
        timeout=120,
        worker=worker,
    )
    got = []
    for record in dead.records:
        assert (record["partition"], record["offset"]) in positions
        element = json.loads(base64.b64decode(record["original_b64"]))
        got.append((element["event_id"], record["reason"]))
        assert record["index"] is not None
    assert sorted(got) == sorted(expected)
    snap = latest_1h(sli.records, "svc-col")
    assert snap is not None
    ttft = np.array([e["ttft_ms"] for e in valid])
    assert snap["ttft_ms"]["p99"] == pytest.approx(float(np.percentile(ttft, 99)), rel=0.01)
