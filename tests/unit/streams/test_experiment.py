"""The A/B guard's state, evaluations and decisions (no broker)."""

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from tailguard.streams.errors import ConfigError
from tailguard.streams.experiment import (
    ExperimentInteractions,
    ExperimentRequests,
    ExperimentState,
    decide,
    decision_id,
    evaluate,
    evidence,
)
from tailguard.streams.experiment_def import ExperimentDef, Guardrail

T0 = 1_700_000_000_000


@dataclass
class Cache:
    prefix_hit_tokens: int
    prefix_query_tokens: int


@dataclass
class Ev:
    """The fields of an InferenceEvent the guard reads."""

    event_id: str
    ts_ms: int
    variant: str
    ttft_ms: float | None
    e2e_ms: float
    status: str = "ok"
    itl_ms: list[float] = field(default_factory=list)
    unit_id: str | None = None
    session_id: str | None = None
    cache: Cache | None = None
    batch: Any = None
    flow_control: Any = None
    prompt_version: str | None = None


@dataclass
class Act:
    event_id: str
    ts_ms: int
    kind: str
    variant: str | None
    unit_id: str | None
    session_id: str | None


class Book(dict[int, str]):
    def arm_of(self, unit: int) -> str | None:
        return self.get(unit)

    def remember(self, unit: int, arm: str) -> None:
        self[unit] = arm

    def interrupted(self, session: int) -> bool:
        return session in self

    def mark_interrupted(self, session: int) -> None:
        self[session] = "1"

    def forget(self, session: int) -> None:
        self.pop(session, None)


def definition(**extra: Any) -> ExperimentDef:
    data: dict[str, Any] = {
        "id": "exp",
        "arms": [{"name": "control", "weight": 0.5}, {"name": "treatment", "weight": 0.5}],
        "guardrails": {"ttft_p95": {"max_ratio": 1.10}, "success_rate": {"min": 0.99}},
        "min_samples": {"units": 100, "requests": 500},
        "evaluate_every_s": 10,
    }
    data.update(extra)
    return ExperimentDef.from_mapping(data)


def traffic(
    n: int,
    *,
    seed: int = 0,
    slow: float = 1.0,
    treatment_share: float = 0.5,
    miss_treatment: bool = False,
    start: int = T0,
    gap_ms: int = 10,
) -> list[Ev]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        unit = int(rng.integers(0, 10**9))
        arm = "treatment" if rng.random() < treatment_share else "control"
        ttft = float(rng.lognormal(math.log(180.0), 0.35)) * (slow if arm == "treatment" else 1.0)
        miss = miss_treatment and arm == "treatment"
        out.append(
            Ev(
                event_id=f"{seed}-{i}",
                ts_ms=start + i * gap_ms,
                variant=arm,
                ttft_ms=ttft,
                e2e_ms=ttft + 800.0,
                itl_ms=[float(g) for g in rng.lognormal(math.log(30.0), 0.2, 4)],
                unit_id=f"u{unit}",
                session_id=f"s{unit}",
                cache=Cache(50 if miss else 990, 1000),
                prompt_version="v2" if miss else "v1",
            )
        )
    return out


def run(
    defn: ExperimentDef, events: list[Ev], *, batch: int = 250, lateness: int = 2000
) -> tuple[ExperimentState, list[Any]]:
    state, units = ExperimentState(defn.id), Book()
    published = []
    for lo in range(0, len(events), batch):
        chunk = events[lo : lo + batch]
        cols = ExperimentRequests.from_events(chunk, [(0, lo // batch)] * len(chunk))
        state.absorb_requests(defn, cols, units)
        for boundary in state.close_ready(defn, lateness):
            if state.status != "running":
                break
            d = decide(defn, evaluate(defn, state, boundary))
            if state.record(d):
                published.append(d)
    return state, published


# --- definitions -------------------------------------------------------------------


def test_definition_round_trips_through_its_mapping() -> None:
    defn = definition()
    assert ExperimentDef.from_mapping(defn.to_mapping()) == defn
    assert defn.control == "control" and defn.treatments == ("treatment",)
    assert defn.test_alpha == pytest.approx(0.01 / 2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"arms": ["only"]}, "two arms"),
        ({"guardrails": {"ttft_p95": {"min_ratio": 0.9}}}, "wrong side"),
        ({"guardrails": {"latency": {"max_ratio": 1.1}}}, "unknown guardrail metric"),
        ({"guardrails": {"success_rate": {"min": 1.5}}}, r"share in \[0, 1\]"),
        ({"unit": "tenant"}, "unit must be one of"),
        ({"colour": "red"}, "unknown key"),
        ({"alpha": 0.9}, "alpha must be in"),
    ],
)
def test_bad_definitions_say_what_is_wrong(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        definition(**change)


# --- folding -----------------------------------------------------------------------


def test_state_bytes_round_trip() -> None:
    state, _ = run(definition(), traffic(3000))
    again = ExperimentState.from_bytes(state.to_bytes())
    assert again.to_bytes() == state.to_bytes()


def test_a_redelivered_message_adds_nothing() -> None:
    defn, units = definition(), Book()
    events = traffic(400)
    cols = ExperimentRequests.from_events(events, [(3, 17)] * len(events))
    state = ExperimentState(defn.id)
    state.absorb_requests(defn, cols, units)
    once = state.to_bytes()
    assert state.absorb_requests(defn, cols, units) == 0
    assert state.counters["replayed"] == 400
    state.counters.pop("replayed")
    assert state.to_bytes() == once


def test_state_does_not_depend_on_batching() -> None:
    events = traffic(4000, slow=1.05)
    a, da = run(definition(), events, batch=100)
    b, db = run(definition(), events, batch=1000)
    assert a.total.keys() == b.total.keys()
    for arm in a.total:
        assert a.total[arm].to_wire() == b.total[arm].to_wire()
    assert [(d.decision, d.at_ms, d.event_id) for d in da] == [
        (d.decision, d.at_ms, d.event_id) for d in db
    ]


def test_late_requests_are_counted_not_merged() -> None:
    defn, units = definition(), Book()
    state = ExperimentState(defn.id)
    events = traffic(3000)
    state.absorb_requests(defn, ExperimentRequests.from_events(events), units)
    state.close_ready(defn, 0)
    late = traffic(10, seed=9, start=T0)
    taken = state.absorb_requests(defn, ExperimentRequests.from_events(late), units)
    assert taken == 0 and state.counters["late"] == 10


def test_units_count_once_and_crossovers_are_counted() -> None:
    defn, units = definition(), Book()
    state = ExperimentState(defn.id)
    evs = [
        Ev("a", T0, "control", 100.0, 200.0, unit_id="u1"),
        Ev("b", T0 + 1, "control", 100.0, 200.0, unit_id="u1"),
        Ev("c", T0 + 2, "treatment", 100.0, 200.0, unit_id="u1"),
        Ev("d", T0 + 3, "treatment", 100.0, 200.0, unit_id="u2"),
    ]
    state.absorb_requests(defn, ExperimentRequests.from_events(evs), units)
    state.close_ready(defn, -100_000)
    assert state.arm("control").units == 1 and state.arm("treatment").units == 1
    assert state.counters["unit_crossovers"] == 1


def test_interactions_give_interruption_rate_and_session_completion() -> None:
    defn, units, sessions = definition(), Book(), Book()
    state = ExperimentState(defn.id)
    acts = [
        Act("1", T0, "interrupt", "treatment", "u1", "s1"),
        Act("2", T0 + 5, "session_complete", "treatment", "u1", "s1"),
        Act("3", T0 + 6, "session_abandon", "treatment", "u2", "s2"),
        Act("4", T0 + 7, "session_complete", "control", "u3", "s3"),
        Act("5", T0 + 8, "feedback", "control", "u3", "s3"),
    ]
    taken = state.absorb_interactions(
        defn, ExperimentInteractions.from_events(acts), units, sessions
    )
    assert taken == 4
    state.watermark = T0 + 60_000
    state.closed_ms = T0 - T0 % 10_000
    state.close_ready(defn, 0)
    t, c = state.arm("treatment"), state.arm("control")
    assert (t.sessions, t.completed, t.interrupted) == (2, 1, 1)
    assert (c.sessions, c.completed, c.interrupted) == (1, 1, 0)
    assert not sessions


# --- decisions ---------------------------------------------------------------------


def test_an_aa_experiment_is_never_rolled_back() -> None:
    for seed in range(3):
        state, published = run(definition(), traffic(12_000, seed=seed))
        assert all(d.decision != "rollback" for d in published), [d.codes for d in published]
        assert state.status == "running"


def test_a_regression_is_rolled_back_once_with_its_evidence() -> None:
    defn = definition()
    state, published = run(defn, traffic(20_000, slow=1.3))
    rollbacks = [d for d in published if d.decision == "rollback"]
    assert len(rollbacks) == 1 and published[-1] is rollbacks[0]
    rb = rollbacks[0]
    assert rb.arm == "treatment" and rb.weights == {"control": 1.0, "treatment": 0.0}
    assert (
        rb.event_id
        == decision_id("exp", 1, rb.seq, "rollback")
        == decision_id("exp", 1, 99, "rollback")
    )
    assert state.status == "rolled_back"
    assert state.record(rb) is False  # terminal: nothing more is recorded
    assert rb.evaluation is not None
    ev = evidence(defn, rb.evaluation)["metrics"]["ttft_p95.max_ratio"]
    assert ev["status"] == "breached" and ev["interval"][0] > 1.10
    assert ev["p_value"] < ev["alpha"] and ev["p_value_fixed_horizon"] < 1e-6
    assert ev["n"]["treatment"] >= 500 and ev["arms"]["control"]["value"] > 0


def test_sample_ratio_mismatch_holds_and_never_promotes() -> None:
    defn = definition()
    _, published = run(defn, traffic(12_000, treatment_share=0.4))
    assert published and all(d.decision == "hold" for d in published[1:])
    assert any("srm" in d.codes for d in published)
    assert not [d for d in published if d.decision in ("promote", "rollback")]


def test_a_cache_miss_storm_on_one_arm_pollutes_the_experiment() -> None:
    defn = definition(guardrails={"success_rate": {"min": 0.99}})
    _, published = run(defn, traffic(6000, miss_treatment=True))
    held = [d for d in published if d.decision == "hold"]
    assert held and "polluted:prefix_cache_miss:treatment" in held[0].codes
    assert held[0].evaluation is not None
    pollution = held[0].evaluation.pollution[0]
    treated = held[0].evaluation.arms["treatment"].requests
    assert pollution["prompt_versions"]["treatment"] == {"v2": treated}


def test_offline_gain_with_an_online_loss_is_misaligned() -> None:
    defn = definition(guardrails={"ttft_p95": {"max_ratio": 1.5}})
    state, units = ExperimentState(defn.id), Book()
    state.absorb_eval("control", "rouge_l", T0, 0.38, 500)
    state.absorb_eval("treatment", "rouge_l", T0, 0.41, 500)
    assert not state.absorb_eval("treatment", "rouge_l", T0 - 1, 0.1, 500)  # older: ignored
    events = traffic(12_000, slow=1.2)
    state.absorb_requests(defn, ExperimentRequests.from_events(events), units)
    state.close_ready(defn, 0)
    d = decide(defn, evaluate(defn, state, state.closed_ms or 0))
    assert d.decision == "hold" and "misaligned:rouge_l:treatment" in d.codes, d.reasons


def test_promote_needs_every_guardrail_passed_and_the_minimum_samples() -> None:
    defn = definition(guardrails={"ttft_p95": {"max_ratio": 1.25}, "success_rate": {"min": 0.9}})
    _, published = run(defn, traffic(20_000, seed=4))
    assert published[-1].decision == "promote"
    assert published[-1].weights == {"control": 0.0, "treatment": 1.0}


def test_guardrail_describes_itself() -> None:
    g = Guardrail("interruption_rate", "diff", "max", 0.02)
    assert g.name == "interruption_rate.max_diff" and "+0.02" in g.describe()


def test_long_completions_are_thinned_but_keep_their_gap_weight() -> None:
    rng = np.random.default_rng(8)
    events = []
    for i in range(300):
        n = int(rng.integers(1, 400))
        gaps = [float(g) for g in rng.lognormal(math.log(30.0), 0.3, n)]
        events.append(Ev(f"g{i}", T0 + i, "control", 100.0, 900.0, itl_ms=gaps))
    cols = ExperimentRequests.from_events(events)
    assert int(cols.itl_len.max()) <= 16
    assert int((cols.itl_len * cols.itl_weight).sum()) == pytest.approx(
        sum(len(e.itl_ms) for e in events), rel=0.02
    )
    chosen = cols.sampled_gap()
    assert all(chosen[i] in events[i].itl_ms for i in range(len(events)))
    wire = ExperimentRequests.from_wire(cols.to_wire())
    assert np.array_equal(wire.gap, cols.gap) and np.array_equal(wire.itl, cols.itl)
    state, units = ExperimentState("exp"), Book()
    defn = definition()
    state.absorb_requests(defn, cols, units)
    state.close_ready(defn, -(10**9))
    p95 = state.arm("control").itl_all.quantile(0.95)
    exact = float(np.percentile(np.concatenate([e.itl_ms for e in events]), 95))
    assert p95 == pytest.approx(exact, rel=0.03)
