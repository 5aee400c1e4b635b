"""Capacity on the real broker: load ramp across the knee, a failing MoE expert, a drifting index.

One worker consumes three deployments at once (event time compressed: the whole
run is produced up front):

- ``chat/ramp``: concurrency ramps 1 → 13 (knee at 8: flat latency up to it,
  a steep rise after), holds, ramps down to 2 and stays low; GPU samples say
  20 % utilisation and 50 % memory. Expected: one scale-up near 1.2 × knee,
  one scale-down after the ramp down, nothing else (no flapping).
- ``chat/moe``: expert 5 fails 40 % of its requests from its 100th request to
  its 250th. Expected: its breaker opens within 100 of its requests and closes
  after recovery (through half-open).
- ``chat/rag``: index ``kb`` drifts from Beta(18, 3) to Beta(8, 5) top-1
  similarities. Expected: the threshold moves down.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tailguard.simulator import capacity as cap

pytestmark = pytest.mark.integration

KNEE = cap.KNEE
T0 = (int(time.time() * 1000) // 3_600_000 - 3) * 3_600_000  # hour-aligned, 3 h ago


def messages(events: list[dict[str, Any]], key: bytes) -> list[tuple[bytes, bytes]]:
    return [(key, json.dumps(events[i : i + 200]).encode()) for i in range(0, len(events), 200)]


def test_ramp_failing_expert_and_drifting_index(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[..., Any],
    produce: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TAILGUARD_CAPACITY", json.dumps({"scale": {"cooldown_ms": 200_000}}))
    now = int(time.time() * 1000)
    gpu = [(b"h1:0", json.dumps(cap.gpu_sample(now)).encode())]
    produce(namespace.broker, namespace.topic("tailguard.gpu"), gpu)
    out = collector("tailguard.capacity")
    audit = collector("tailguard.audit")
    worker = worker_factory().start()
    time.sleep(8)  # the worker's GPU cache reads the sample before the ramp's intervals close
    topic = namespace.topic("tailguard.inference")
    for model, events in cap.capacity_scenarios(T0).items():
        produce(namespace.broker, topic, messages(events, model.encode()))

    def of(records: list[dict[str, Any]], model: str, kind: str) -> list[dict[str, Any]]:
        return [r for r in records if r["deployment"]["model"] == model and r["kind"] == kind]

    def done(records: list[dict[str, Any]]) -> bool:
        scale = [r for r in of(records, "ramp", "scale") if r["decision"] != "hold"]
        closed = [r for r in of(records, "moe", "breaker") if r["decision"] == "closed"]
        return len(scale) >= 2 and bool(closed) and len(of(records, "rag", "rag_threshold")) >= 2

    out.wait_for(done, timeout=180, worker=worker)
    out.poll(3)
    recs = out.records
    assert all(r["schema"] == "tailguard.capacity.v1" for r in recs)
    assert len({r["event_id"] for r in recs}) == len(recs)
    assert all(dict(h).get("ce_type") == b"tailguard.capacity.v1" for h in out.headers)

    # Ramp: exactly one scale-up near 1.2 × knee, then exactly one scale-down.
    knees = of(recs, "ramp", "knee")
    assert knees and abs(knees[-1]["evidence"]["knee_concurrency"] - KNEE) <= 0.15 * KNEE
    actions = [r for r in of(recs, "ramp", "scale") if r["decision"] != "hold"]
    assert [r["decision"] for r in actions] == ["scale_up", "scale_down"], actions
    up, down = actions
    assert 1.2 * KNEE * 0.9 <= up["evidence"]["concurrency"] <= 1.2 * KNEE * 1.5
    assert down["evidence"]["concurrency"] < 0.6 * up["evidence"]["knee"]
    assert down["evidence"]["util_pct"] == 20.0 and down["evidence"]["mem_fraction"] == 0.5
    warm = of(recs, "ramp", "warmup")
    assert warm and warm[0]["decision"] == "effective"
    assert warm[0]["evidence"]["before_ttft_p50_ms"] == 1200.0

    # Failing expert 5: opens within 100 of its failing-phase requests, closes after recovery.
    moves = [r for r in of(recs, "moe", "breaker") if r["expert"] == 5]
    assert moves[0]["decision"] == "open"
    assert moves[0]["evidence"]["requests_seen"] - 100 <= 100
    assert moves[0]["evidence"]["fallback_share"] > 0
    assert moves[-1]["decision"] == "closed" and moves[-1]["evidence"]["before"] == "half_open"
    assert all(r["expert"] == 5 for r in of(recs, "moe", "breaker"))

    # Drifting index: the threshold goes down.
    rag = of(recs, "rag", "rag_threshold")
    assert rag[0]["decision"] == "initial" and rag[0]["index"] == "kb"
    assert rag[-1]["evidence"]["threshold"] < rag[0]["evidence"]["threshold"] - 0.1

    # Every publication is audited.
    audit.wait_for(
        lambda rs: sum(str(r.get("action", "")).startswith("capacity.") for r in rs) >= len(recs),
        timeout=30,
    )
