"""Release decisions become routing overrides once, persist, and are audited."""

import json
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
from tailguard.schemas.release import ReleaseDecision

from tailguard.gateway.releases import DecisionStore, ReleaseFollower, apply_decision
from tailguard.gateway.routing import ArmRoute, ExperimentRoute, Override

REPO = Path(__file__).resolve().parents[3]
EXP = ExperimentRoute(
    "exp-1", (ArmRoute("control", 1, "primary"), ArmRoute("treatment", 1, "canary")), "control"
)


def decision(
    kind: str, seq: int = 1, gen: int = 1, arm: str | None = "treatment"
) -> ReleaseDecision:
    return ReleaseDecision(
        event_id=f"rel-{gen}-{seq}",
        ts_ms=1_700_000_000_000,
        experiment="exp-1",
        generation=gen,
        seq=seq,
        decision=kind,  # type: ignore[arg-type]
        arm=arm,
        control="control",
        reasons=["ttft_p95 worse"],
        reason_codes=["guardrail"],
        evidence={},
        weights={"control": 1.0, "treatment": 0.0},
        planned_weights={"control": 0.5, "treatment": 0.5},
        actor="tailguard",
        decided_at_ms=1_700_000_000_000,
    )


ROLLED = Override("exp-1", "rollback", "treatment", 1, 3, "x")


@pytest.mark.parametrize(
    ("held", "incoming", "change", "kept"),
    [
        (None, decision("rollback"), "rollback", "rollback"),
        (None, decision("continue"), None, "continue"),
        (ROLLED, decision("rollback", 3), None, "rollback"),
        (ROLLED, decision("continue", 2), None, "rollback"),
        (ROLLED, decision("continue", 4), None, "rollback"),
        (ROLLED, decision("continue", 1, gen=2), "reset", "continue"),
        (Override("exp-1", "hold", None, 1, 3, "x"), decision("promote", 4), "promote", "promote"),
    ],
)  # fmt: skip
def test_apply_decision(held: Override | None, incoming: ReleaseDecision, change: str | None,
                        kept: str) -> None:  # fmt: skip
    new, what = apply_decision(held, incoming, 5)
    assert what == change and new is not None and new.decision == kept


def test_state_file_round_trips_and_tolerates_garbage(tmp_path: Path) -> None:
    store = DecisionStore(tmp_path / "gw" / "state.json")
    assert store.load() == {}
    held = {"exp-1": Override("exp-1", "rollback", "treatment", 1, 3, "ev", 7)}
    store.save(held)
    assert store.load() == held
    store.path.write_text("{not json")
    assert store.load() == {}


def _follower(tmp_path: Path, producer: Any, seen: list[dict[str, Override]]) -> ReleaseFollower:
    return ReleaseFollower(
        "unused:9092",
        "t.tailguard.releases",
        "t.tailguard.audit",
        store=DecisionStore(tmp_path / "state.json"),
        overrides={},
        experiments=lambda: {"exp-1": EXP},
        on_change=seen.append,
        instance="gw-1",
        source="tailguard-gateway/test",
        producer=producer,
    )


def test_a_rollback_reroutes_persists_and_is_audited_once(tmp_path: Path, producer: Any) -> None:
    seen: list[dict[str, Override]] = []
    f = _follower(tmp_path, producer, seen)
    raw = msgspec.json.encode(decision("rollback", 2))
    assert f.handle(raw) == "rollback"
    assert f.handle(raw) is None  # re-read after a restart: nothing new
    assert len(seen) == 1 and seen[0]["exp-1"].decision == "rollback"
    assert DecisionStore(tmp_path / "state.json").load()["exp-1"].seq == 2
    producer.poll()
    assert len(producer.sent) == 1
    record = json.loads(producer.sent[0]["value"])
    schema = json.loads((REPO / "schemas/jsonschema/tailguard.audit.v1.json").read_text())
    jsonschema.validate(record, schema)
    assert record["kind"] == "decision" and record["action"] == "gateway.route"
    assert record["args"]["routes"] == {"control": "control", "treatment": "control"}
    assert dict(producer.sent[0]["headers"])["ce_type"] == b"tailguard.audit.v1"


def test_unreadable_decisions_are_counted_and_skipped(tmp_path: Path, producer: Any) -> None:
    f = _follower(tmp_path, producer, [])
    assert f.handle(b"{nope") is None and f.handle(b'{"decision": "rollback"}') is None
    assert f.bad == 2 and f.overrides == {}
