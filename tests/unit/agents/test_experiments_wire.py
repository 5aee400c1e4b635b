"""The experiment agents' wire: internal records, routing, release and audit payloads."""

import json

import msgspec
import pytest
from tailguard.agents.experiments import (
    ControlMsg,
    ReqMsg,
    audit_payload,
    decode_internal,
    partition_of,
    release_payload,
    route_requests,
)
from tailguard.schemas import decode
from tailguard.schemas.outputs import AuditRecord
from tailguard.schemas.release import ReleaseDecision
from tailguard.streams.experiment import (
    ExperimentRequests,
    ExperimentState,
    decide,
    evaluate,
)
from tailguard.streams.experiment_def import ExperimentDef

from tailguard.simulator.config import Incident, SimConfig
from tailguard.simulator.model import generate

T0 = 1_700_000_000_000


class Units(dict[int, str]):
    def arm_of(self, unit: int) -> str | None:
        return self.get(unit)

    def remember(self, unit: int, arm: str) -> None:
        self[unit] = arm


def canary_events(seconds: float = 240.0) -> list[object]:
    cfg = SimConfig(
        rate=20,
        duration_s=seconds,
        seed=5,
        experiment="canary",
        start_ms=T0,
        incidents=(Incident("prompt_cache_miss", 0.0, seconds),),
    )
    evs = list(generate(cfg))
    out: list[object] = []
    for lo in range(0, len(evs), 200):
        raw = json.dumps(evs[lo : lo + 200]).encode()
        out += decode(raw, "inference", now_ms=T0 + 10**9).valid
    return out


def test_requests_are_routed_per_experiment_and_cut_only_between_input_messages() -> None:
    events = canary_events(60.0)
    positions = [(0, i // 100) for i in range(len(events))]
    routed = route_requests(events, positions, partitions=4, max_bytes=20_000)
    assert len(routed) > 1
    assert {p for p, _, _ in routed} == {partition_of("canary", 4)}
    seen: list[tuple[int, int]] = []
    for _, key, value in routed:
        msg = decode_internal(value)
        assert isinstance(msg, ReqMsg) and key == b"canary"
        cols = ExperimentRequests.from_wire(msg.cols)
        offsets = sorted(set(cols.offset.tolist()))
        assert not set(offsets) & {o for _, o in seen}, "an input message was split"
        seen += [(0, o) for o in offsets]
    assert sum(
        len(ExperimentRequests.from_wire(decode_internal(v).cols)) for *_, v in routed
    ) == len(events)  # type: ignore[union-attr]


def test_undecodable_internal_records_raise_value_error() -> None:
    with pytest.raises(ValueError):
        decode_internal(b"\x93garbage")
    ctl = ControlMsg("c1", "stop", "canary", "alice", T0)
    assert decode_internal(msgspec.msgpack.encode(ctl)) == ctl


def test_the_release_payload_carries_the_spec_fields_and_is_deterministic() -> None:
    defn = ExperimentDef.from_mapping(
        {
            "id": "canary",
            "arms": ["control", "treatment"],
            "guardrails": {"ttft_p95": {"max_ratio": 1.1}, "success_rate": {"min": 0.992}},
            "min_samples": {"requests": 300},
        }
    )
    events = canary_events()
    state, units = ExperimentState("canary"), Units()
    state.absorb_requests(
        defn, ExperimentRequests.from_events(events, [(0, 1)] * len(events)), units
    )
    boundary = state.close_ready(defn, 0)[-1]
    d = decide(defn, evaluate(defn, state, boundary))
    assert state.record(d) and d.decision == "rollback"
    payload = release_payload(d, defn)
    for key in ("experiment", "decision", "arm", "reasons", "evidence", "weights"):
        assert key in payload
    metric = payload["evidence"]["metrics"]["ttft_p95.max_ratio"]
    for key in ("arms", "difference", "interval", "p_value", "n"):
        assert metric[key] is not None
    json.dumps(payload, allow_nan=False)  # plain JSON, no NaN/Infinity
    decoded = msgspec.json.decode(msgspec.json.encode(payload), type=ReleaseDecision)
    assert decoded.decision == "rollback" and decoded.weights["control"] == 1.0
    assert release_payload(d, defn) == payload  # same bytes on a replay
    audit = audit_payload(d, payload["weights"], worker="w1")
    record = msgspec.convert(audit, AuditRecord)
    assert record.kind == "decision" and record.action == "release.rollback"
    assert record.args is not None and record.args["release_event_id"] == d.event_id
