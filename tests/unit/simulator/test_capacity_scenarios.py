"""The capacity scenarios: valid contract events, deterministic, and shaped as documented."""

import json
import time

import numpy as np
from tailguard.agents.capacity import CapacityTuning
from tailguard.schemas import decode

from tailguard.simulator import capacity as cap

START = (int(time.time() * 1000) // 3_600_000 - 3) * 3_600_000


def test_scenarios_are_valid_inference_events_and_deterministic() -> None:
    a = cap.capacity_scenarios(START)
    assert a == cap.capacity_scenarios(START)
    now = int(time.time() * 1000)
    for model, events in a.items():
        decoded = decode(json.dumps(events).encode(), "inference", now_ms=now)
        assert decoded.rejects == [], model
        assert len(decoded.valid) == len(events)
    rag = decode(json.dumps(a["rag"][:1]).encode(), "inference", now_ms=now).valid[0]
    assert rag.rag_index == "kb" and rag.rag_top1_similarity is not None
    plain = decode(json.dumps(a["moe"][:1]).encode(), "inference", now_ms=now).valid[0]
    assert plain.rag_index == "default" and plain.expert_ids == [0]


def test_ramp_crosses_the_knee_and_comes_back_down() -> None:
    sched = cap.ramp_schedule()
    assert max(sched) >= 1.5 * cap.KNEE and sched[-1] < 0.6 * cap.KNEE
    assert cap.ramp_latency(cap.KNEE) == cap.ramp_latency(1.0) < cap.ramp_latency(12.0)


def test_failing_expert_fails_only_in_its_window() -> None:
    events = cap.expert_failure(START, expert=5)
    errors = [e for e in events if e["status"] == "error"]
    assert errors and all(e["expert_ids"] == [5] for e in errors)
    nth = np.array([int(e["event_id"].rsplit("-", 1)[1]) // 8 for e in errors])
    assert nth.min() >= 100 and nth.max() < 250


def test_tuning_reads_nested_json() -> None:
    t = CapacityTuning.from_json('{"interval_ms": 5000, "scale": {"cooldown_ms": 1}}')
    assert t.interval_ms == 5000 and t.scale.cooldown_ms == 1 and t.scale.up_factor == 1.2
    assert CapacityTuning.from_json("") == CapacityTuning()
