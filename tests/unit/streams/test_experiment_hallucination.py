"""The human-in-the-loop hallucination guardrail of the A/B guard (no broker)."""

from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pytest
from tailguard.streams import experiment as experiment_mod
from tailguard.streams.experiment import (
    ExperimentInteractions,
    ExperimentRequests,
    ExperimentState,
    decide,
    evaluate,
    evidence,
    look_index,
)
from tailguard.streams.experiment_def import ExperimentDef

T0 = 1_700_000_000_000
EVERY = 10_000


@dataclass
class Req:
    event_id: str
    ts_ms: int
    variant: str
    prompt_version: str | None
    unit_id: str | None
    ttft_ms: float = 100.0
    e2e_ms: float = 400.0
    status: str = "ok"
    itl_ms: tuple[float, ...] = ()
    session_id: str | None = None
    cache: Any = None
    batch: Any = None
    flow_control: Any = None


@dataclass
class Feedback:
    event_id: str
    ts_ms: int
    request_event_id: str | None
    label: str
    rater: str
    variant: str | None = None
    unit_id: str | None = None
    session_id: str | None = None
    kind: str = "feedback"


class Books(dict[int, Any]):
    """Unit, session and request book in one dict (as the agent's table)."""

    def arm_of(self, unit: int) -> str | None:
        return self.get(unit)

    def remember(self, unit: int, arm: str) -> None:
        self[unit] = arm

    def interrupted(self, session: int) -> bool:
        return False

    def mark_interrupted(self, session: int) -> None:
        pass

    def forget(self, session: int) -> None:
        pass

    def request(self, event: int) -> tuple[str, str] | None:
        return self.get(("r", event))

    def remember_request(self, event: int, arm: str, prompt_version: str) -> None:
        self[("r", event)] = (arm, prompt_version)  # type: ignore[index]


def definition(**extra: Any) -> ExperimentDef:
    data: dict[str, Any] = {
        "id": "prompt-exp",
        "arms": [{"name": "control", "weight": 0.5}, {"name": "treatment", "weight": 0.5}],
        "guardrails": {"hallucination_rate": {"max_diff": 0.02}},
        "min_samples": {"units": 0, "requests": 100, "ratings": 200},
        "evaluate_every_s": EVERY // 1000,
    }
    data.update(extra)
    return ExperimentDef.from_mapping(data)


def simulate(
    defn: ExperimentDef,
    *,
    n: int,
    rates: tuple[float, float],
    seed: int,
    blind: bool = True,
    rounds: int = 8,
    groups: bool = False,
) -> tuple[ExperimentState, list[Any], Books]:
    """``rounds`` periods; in each, n requests per period and a rating of each, the
    feedback only naming the request (blind) unless ``blind`` is False."""
    rng = np.random.default_rng(seed)
    state, books = ExperimentState(defn.id), Books()
    published: list[Any] = []
    per = n // rounds
    for rnd in range(rounds + 2):
        start = T0 + rnd * EVERY
        reqs = []
        for i in range(per if rnd < rounds else 10):
            arm = "treatment" if rng.random() < 0.5 else "control"
            version = ("v2" if arm == "treatment" else "v1") if not groups else f"g{i % 3}-{arm}"
            reqs.append(Req(f"{seed}-{rnd}-{i}", start + i, arm, version, f"u{seed}-{rnd}-{i}"))
        cols = ExperimentRequests.from_events(reqs, [(0, rnd)] * len(reqs))
        state.absorb_requests(defn, cols, books, books)
        if rnd < rounds:
            acts = []
            for r in reqs:
                rate = rates[1] if r.variant == "treatment" else rates[0]
                u = rng.random()
                label = "hallucination" if u < rate else "partial" if u < rate + 0.1 else "correct"
                acts.append(
                    Feedback(
                        f"f-{r.event_id}", r.ts_ms + 500, r.event_id, label,
                        f"rater-{int(rng.integers(0, 7))}",
                        variant=None if blind else r.variant,
                    )
                )  # fmt: skip
            x = ExperimentInteractions.from_events(acts, [(1, rnd)] * len(acts))
            state.absorb_interactions(defn, x, books, books, books, None)
        for boundary in state.close_ready(defn, 1000):
            if state.status != "running":
                break
            d = decide(defn, evaluate(defn, state, boundary))
            if state.record(d):
                published.append(d)
    return state, published, books


def test_blind_feedback_finds_its_arm_and_stratum_through_the_rated_request() -> None:
    defn = definition()
    state, _, _ = simulate(defn, n=800, rates=(0.03, 0.03), seed=1)
    t, c = state.arm("treatment"), state.arm("control")
    assert t.rated + c.rated == 800 and state.counters["ratings"] == 800
    assert set(t.ratings) == {"v2"} and set(c.ratings) == {"v1"}  # the request's version
    assert 1 <= len(t.raters) <= 7
    assert "interactions_unknown_arm" not in state.counters


def test_feedback_for_an_unknown_request_falls_back_to_its_unit_and_an_unknown_stratum() -> None:
    defn, books = definition(), Books()
    state = ExperimentState(defn.id)
    reqs = [Req("r1", T0, "treatment", "v2", "u1")]
    state.absorb_requests(defn, ExperimentRequests.from_events(reqs), books, books)
    acts = [
        Feedback("f1", T0 + 1, "not-seen", "hallucination", "ann", unit_id="u1"),
        Feedback("f2", T0 + 2, "not-seen", "correct", "bob"),  # nothing to join on
        Feedback("f3", T0 + 3, "r1", "correct", "bob", variant="control"),  # its own arm wins
    ]
    state.absorb_interactions(
        defn, ExperimentInteractions.from_events(acts), books, books, books, None
    )
    state.watermark = T0 + 60_000
    state.close_ready(defn, 0)
    assert state.arm("treatment").ratings == {"unknown": [1, 1, 0]}
    assert state.arm("control").ratings == {"v2": [1, 0, 0]}
    assert state.counters["interactions_unknown_arm"] == 1


def test_a_five_point_rise_is_rolled_back_with_the_human_feedback_evidence() -> None:
    defn = definition()
    state, published, _ = simulate(defn, n=3200, rates=(0.03, 0.08), seed=2)
    rollbacks = [d for d in published if d.decision == "rollback"]
    assert len(rollbacks) == 1 and rollbacks[0].arm == "treatment"
    d = rollbacks[0]
    assert "guardrail_breached:hallucination_rate.max_diff:treatment" in d.codes
    assert any("stratified permutation p" in r for r in d.reasons)
    m = evidence(defn, d.evaluation)["metrics"]["hallucination_rate.max_diff"]  # type: ignore[arg-type]
    test = m["test"]
    assert m["status"] == "breached" and m["difference"] > 0.02
    assert test["p_value"] < test["alpha_per_look"] == pytest.approx(0.01 / 6)
    assert test["raters"] == 7 and set(test["strata"]) == {"v1", "v2"}
    assert test["pooled_single_arm_strata"] is True  # the versions are the arms
    assert m["n"]["treatment"] >= 200 and m["n"]["control"] >= 200
    assert state.status == "rolled_back"


@pytest.mark.parametrize("seed", range(4))
def test_no_change_is_never_rolled_back(seed: int) -> None:
    state, published, _ = simulate(definition(), n=3200, rates=(0.03, 0.03), seed=10 + seed)
    assert all(d.decision != "rollback" for d in published), [d.reasons for d in published]
    assert state.status == "running"


def test_the_test_runs_only_at_information_milestones(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = experiment_mod.stratified_permutation_test

    def counting(strata: Any, **kw: Any) -> Any:
        calls.append(sum(s.n_t + s.n_c for s in strata.values()))
        return real(strata, **kw)

    monkeypatch.setattr(experiment_mod, "stratified_permutation_test", counting)
    defn = definition(rating_looks=3)
    state, _, _ = simulate(defn, n=4000, rates=(0.03, 0.03), seed=5, rounds=16)
    # 16+ evaluations, but only the milestones 200, 400, 800 per arm are looks
    assert 1 <= len(calls) <= 3
    assert state.looks["hallucination_rate.max_diff@treatment"][0] == len(calls) - 1
    assert [look_index(defn, n) for n in (0, 199, 200, 399, 400, 800, 10**6)] == [
        -1, -1, 0, 0, 1, 2, 2,
    ]  # fmt: skip


def test_a_replay_takes_the_same_decisions_with_the_same_p_values() -> None:
    defn = definition()
    _, a, _ = simulate(defn, n=3200, rates=(0.03, 0.06), seed=8)
    _, b, _ = simulate(defn, n=3200, rates=(0.03, 0.06), seed=8)

    def key(ds: list[Any]) -> list[Any]:
        return [(d.decision, d.event_id, d.reasons) for d in ds]

    assert key(a) == key(b) and a


def test_prompt_groups_stratify_when_given() -> None:
    defn = definition()
    rng = np.random.default_rng(0)
    state, books = ExperimentState(defn.id), Books()
    reqs = [
        Req(f"r{i}", T0 + i, arm, f"{g}-{arm}", f"u{i}")
        for i in range(400)
        for arm, g in [(("control", "treatment")[int(rng.integers(0, 2))], f"g{i % 2}")]
    ]
    state.absorb_requests(defn, ExperimentRequests.from_events(reqs), books, books)
    acts = [Feedback(f"f{r.event_id}", r.ts_ms, r.event_id, "correct", "ann") for r in reqs]
    state.absorb_interactions(
        defn,
        ExperimentInteractions.from_events(acts),
        books, books, books,
        lambda version: version.split("-")[0],  # the prompt group of a version
    )  # fmt: skip
    state.watermark = T0 + 60_000
    state.close_ready(defn, 0)
    assert set(state.arm("treatment").ratings) == set(state.arm("control").ratings) == {"g0", "g1"}


def test_state_written_before_the_guardrail_existed_still_restores() -> None:
    state, _, _ = simulate(definition(), n=800, rates=(0.03, 0.03), seed=3)
    wire = msgspec.msgpack.decode(state.to_bytes())
    old = wire[:-1]  # no looks
    old[8] = {a: w[:4] for a, w in old[8].items()}  # total: arms without ratings / raters
    old[9] = {t: {a: w[:4] for a, w in arms.items()} for t, arms in old[9].items()}
    restored = ExperimentState.from_bytes(msgspec.msgpack.encode(old))
    assert restored.looks == {} and restored.arm("control").ratings == {}
    assert restored.arm("control").requests == state.arm("control").requests


def test_interaction_columns_from_before_feedback_still_decode() -> None:
    acts = [Feedback("f", T0, "r", "hallucination", "ann", variant="control")]
    wire = msgspec.msgpack.decode(
        msgspec.msgpack.encode(ExperimentInteractions.from_events(acts).to_wire())
    )
    old = msgspec.msgpack.encode(wire[:8])
    cols = ExperimentInteractions.from_wire(
        msgspec.msgpack.decode(old, type=experiment_mod._InteractionsWire)
    )
    assert cols.label.tolist() == [0] and cols.request.tolist() == [0]
