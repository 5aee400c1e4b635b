"""Release decisions name the prompt versions behind the bad requests (issue 10 item 5)."""

import itertools
import math
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pytest
from tailguard.streams.experiment import (
    ArmStats,
    ExperimentRequests,
    ExperimentState,
    _ArmWire,
    _RequestsWire,
    _StateWire,
    decide,
    evaluate,
    evidence,
)
from tailguard.streams.experiment_def import ExperimentDef

T0 = 1_700_000_000_000
EVERY = 10_000
GROUPS = {"v1": "g-base", "v2": "g-new"}


@dataclass
class Req:
    """The fields of an InferenceEvent the guard reads, with a trace id."""

    event_id: str
    ts_ms: int
    variant: str
    prompt_version: str | None
    ttft_ms: float | None
    e2e_ms: float
    status: str = "ok"
    trace_id: str | None = None
    unit_id: str | None = None
    session_id: str | None = None
    itl_ms: tuple[float, ...] = ()
    cache: Any = None
    batch: Any = None
    flow_control: Any = None


class Book(dict[int, str]):
    def arm_of(self, unit: int) -> str | None:
        return self.get(unit)

    def remember(self, unit: int, arm: str) -> None:
        self[unit] = arm


def definition(min_requests: int = 200, **guardrails: Any) -> ExperimentDef:
    return ExperimentDef.from_mapping(
        {
            "id": "prompt-canary",
            "arms": [{"name": "control", "weight": 0.5}, {"name": "treatment", "weight": 0.5}],
            "guardrails": guardrails or {"ttft_p95": {"max_ratio": 1.10}},
            "min_samples": {"units": 0, "requests": min_requests},
            "evaluate_every_s": EVERY // 1000,
        }
    )


def is_bad(r: Req, ttft_limit: float = 800.0) -> bool:
    if r.status in ("error", "timeout", "rejected"):
        return True
    return r.status == "ok" and r.ttft_ms is not None and r.ttft_ms > ttft_limit


def traffic(n: int, seed: int = 0) -> list[Req]:
    """Control on v1; the treatment half on v1, half on the new v2, which is slow
    for 40 % of its requests. A few control requests fail (its own bad ones)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        arm = "treatment" if rng.random() < 0.5 else "control"
        version = "v2" if arm == "treatment" and rng.random() < 0.5 else "v1"
        ttft = float(rng.lognormal(math.log(180.0), 0.3))
        if version == "v2" and rng.random() < 0.4:
            ttft = float(rng.uniform(900.0, 3000.0))
        status = "error" if arm == "control" and rng.random() < 0.005 else "ok"
        out.append(
            Req(
                event_id=f"{seed}-{i}",
                ts_ms=T0 + i * 10,
                variant=arm,
                prompt_version=version,
                ttft_ms=ttft,
                e2e_ms=round(ttft + float(rng.uniform(200.0, 900.0)), 3),
                status=status,
                trace_id=f"{seed:08x}{i:024x}",
                unit_id=f"u{seed}-{i}",
            )
        )
    return out


def run(
    defn: ExperimentDef, events: list[Req], batch: int, split: int = 1
) -> tuple[ExperimentState, list[Any]]:
    """Absorb ``batch`` events at a time (as ``split`` messages), then judge."""
    state, book = ExperimentState(defn.id), Book()
    published = []
    for lo in range(0, len(events), batch):
        for cut in np.array_split(np.arange(lo, min(lo + batch, len(events))), split):
            part = [events[i] for i in cut.tolist()]
            cols = ExperimentRequests.from_events(part, [(0, int(i)) for i in cut])
            state.absorb_requests(defn, cols, book)
        for boundary in state.close_ready(defn, 1000):
            if state.status != "running":
                break
            d = decide(defn, evaluate(defn, state, boundary))
            if state.record(d):
                published.append(d)
    return state, published


def test_the_treatments_new_prompt_version_is_named_first_with_its_own_traces() -> None:
    defn = definition()
    events = traffic(6000)
    _, published = run(defn, events, batch=500)
    rollbacks = [d for d in published if d.decision == "rollback"]
    assert len(rollbacks) == 1 and rollbacks[0].arm == "treatment"
    d = rollbacks[0]
    ev = evidence(defn, d.evaluation, group_of=GROUPS.get)

    folded = [r for r in events if r.ts_ms < d.at_ms]
    v2_bad = [r for r in folded if r.variant == "treatment" and r.prompt_version == "v2"]
    v2_bad = [r for r in v2_bad if is_bad(r)]
    slowest = sorted(v2_bad, key=lambda r: (r.e2e_ms, r.trace_id), reverse=True)[:3]

    top = ev["prompts"]["treatment"][0]
    assert top["prompt_version"] == "v2" and top["prompt_group"] == "g-new"
    assert top["bad"] == len(v2_bad) > 0
    assert top["exemplars"] == [r.trace_id for r in slowest]
    assert top["lift"] > 1.5
    treatment_v1 = [row for row in ev["prompts"]["treatment"] if row["prompt_version"] == "v1"]
    assert all(row["bad"] < top["bad"] for row in treatment_v1)
    group = ev["prompt_groups"]["treatment"][0]
    assert group["prompt_group"] == "g-new" and group["versions"] == ["v2"]
    assert group["exemplars"] == top["exemplars"]
    # the control, for comparison: v1 holds its (few) bad requests, failed ones
    control_bad = [r for r in folded if r.variant == "control" and is_bad(r)]
    rows = ev["prompts"]["control"]
    assert [row["prompt_version"] for row in rows] == (["v1"] if control_bad else [])
    assert ev["bad_requests"]["ttft_ms_limit"] == 800.0
    assert ev["bad_requests"]["counts"]["control"] == len(control_bad)
    assert "hallucinations" not in ev


def test_every_decision_carries_the_prompt_evidence_even_a_continue() -> None:
    defn = definition(min_requests=100_000)
    _, published = run(defn, traffic(2500), batch=500)
    assert published and published[0].decision == "continue"
    ev = evidence(defn, published[0].evaluation)
    assert set(ev["prompts"]) == set(ev["prompt_groups"]) == {"control", "treatment"}
    assert ev["prompts"]["treatment"][0]["prompt_group"] is None  # no registry: own group


def test_an_absolute_ttft_guardrail_sets_what_counts_as_bad() -> None:
    defn = definition(ttft_p95={"max": 500.0, "max_ratio": 1.5})
    assert defn.bad_ttft_ms == 500.0
    reqs = [
        Req("a", T0, "treatment", "v2", 600.0, 900.0, trace_id="a" * 32),
        Req("b", T0 + 1, "treatment", "v2", 400.0, 950.0, trace_id="b" * 32),
        Req("c", T0 + 2, "treatment", "v2", None, 990.0, status="timeout", trace_id="c" * 32),
        Req("d", T0 + 3, "treatment", "v2", 100.0, 999.0, status="cancelled", trace_id="d" * 32),
        Req("e", T0 + 4, "treatment", "v2", 700.0, 980.0),  # bad, but no trace to show
    ]
    state = ExperimentState(defn.id)
    state.absorb_requests(defn, ExperimentRequests.from_events(reqs), Book())
    state.watermark = T0 + 60_000
    state.close_ready(defn, 0)
    t = state.arm("treatment")
    assert t.bad == 3
    tally = t.prompt_tallies["v2"]
    assert (tally.requests, tally.bad) == (5, 3)
    assert tally.exemplars == [(990.0, "c" * 32), (900.0, "a" * 32)]


def test_message_sizes_and_replay_give_the_same_decisions_and_evidence() -> None:
    defn = definition()
    events = traffic(6000, seed=3)
    _, one = run(defn, events, batch=1000)
    _, many = run(defn, events, batch=1000, split=7)
    assert one and one[-1].decision == "rollback"
    assert [(d.decision, d.at_ms, d.codes) for d in one] == [
        (d.decision, d.at_ms, d.codes) for d in many
    ]
    for a, b in zip(one, many, strict=True):
        ea = evidence(defn, a.evaluation, group_of=GROUPS.get)
        eb = evidence(defn, b.evaluation, group_of=GROUPS.get)
        assert (ea["prompts"], ea["prompt_groups"]) == (eb["prompts"], eb["prompt_groups"])


def arm_of(events: list[Req]) -> ArmStats:
    s = ArmStats()
    s.add_requests(ExperimentRequests.from_events(events), 0)
    return s


def tallies(s: ArmStats) -> dict[str, Any]:
    return {k: (t.requests, t.bad, t.exemplars) for k, t in s.prompt_tallies.items()}


def test_merging_arm_stats_does_not_depend_on_the_order() -> None:
    events = traffic(900, seed=5)
    for r in events[::7]:  # equal latencies: ties are broken by the trace id
        r.e2e_ms, r.ttft_ms = 2000.0, 1500.0
    parts = [events[0:300], events[300:600], events[600:900]]
    results = []
    for order in itertools.permutations(range(3)):
        total = ArmStats()
        for i in order:
            total.merge(arm_of(parts[i]))
        results.append((total.bad, tallies(total)))
    assert all(r == results[0] for r in results)
    whole = arm_of(events)
    assert results[0] == (whole.bad, tallies(whole))


def test_prompt_tallies_are_bounded_and_keep_the_versions_with_bad_requests() -> None:
    reqs = [
        Req(f"r{i}", T0 + i, "treatment", f"p{i % 12:02d}", 100.0, 300.0, trace_id=f"{i:032x}")
        for i in range(240)
    ]
    for r in reqs:
        if r.prompt_version == "p11":
            r.status = "error"
    s = arm_of(reqs[:120])
    s.merge(arm_of(reqs[120:]))
    assert len(s.prompt_tallies) == 8 and "~other" in s.prompt_tallies
    assert s.prompt_tallies["p11"].bad == 20
    assert sum(t.requests for t in s.prompt_tallies.values()) == 240


def test_old_request_messages_without_trace_ids_still_decode() -> None:
    cols = ExperimentRequests.from_events(traffic(5))
    assert cols.traces == [f"{0:08x}{i:024x}" for i in range(5)]
    old = msgspec.msgpack.decode(msgspec.msgpack.encode(cols.to_wire()))[:-1]
    back = ExperimentRequests.from_wire(
        msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=_RequestsWire)
    )
    assert back.traces == [""] * 5 and len(back.take(np.array([4, 1]))) == 2
    new = msgspec.msgpack.decode(msgspec.msgpack.encode(cols.to_wire()), type=_RequestsWire)
    assert ExperimentRequests.from_wire(new).traces == cols.traces


def test_a_request_message_with_too_few_trace_ids_is_refused() -> None:
    wire = ExperimentRequests.from_events(traffic(3)).to_wire()
    wire.traces = wire.traces[:2]
    with pytest.raises(ValueError, match="disagree"):
        ExperimentRequests.from_wire(wire)


def test_old_state_without_prompt_tallies_restores_and_new_state_round_trips() -> None:
    defn = definition()
    state, _ = run(defn, traffic(3000, seed=7), batch=1000)
    assert state.arm("treatment").prompt_tallies
    back = ExperimentState.from_bytes(state.to_bytes())
    assert tallies(back.arm("treatment")) == tallies(state.arm("treatment"))
    assert back.arm("treatment").bad == state.arm("treatment").bad > 0

    raw = msgspec.msgpack.decode(state.to_bytes())
    fields = _StateWire.__struct_fields__
    n_arm = len(_ArmWire.__struct_fields__)
    total = raw[fields.index("total")]
    for arm in total:
        assert len(total[arm]) == n_arm
        total[arm] = total[arm][: n_arm - 2]  # as written before bad / prompt_tallies
    old = ExperimentState.from_bytes(msgspec.msgpack.encode(raw))
    t = old.arm("treatment")
    assert t.bad == 0 and t.prompt_tallies == {}
    assert t.requests == state.arm("treatment").requests


def test_a_hallucination_rollback_lists_the_hallucinations_per_stratum() -> None:
    defn = ExperimentDef.from_mapping(
        {
            "id": "prompt-halluc",
            "arms": ["control", "treatment"],
            "guardrails": {"hallucination_rate": {"max_diff": 0.02}},
            "min_samples": {"units": 0, "requests": 100, "ratings": 200},
        }
    )
    state = ExperimentState(defn.id)
    t, c = ArmStats(), ArmStats()
    t.ratings = {"g-new": [300, 45, 5], "g-base": [100, 2, 1]}
    c.ratings = {"g-base": [200, 6, 4], "g-new": [200, 4, 2]}
    state.total = {"control": c, "treatment": t}
    d = decide(defn, evaluate(defn, state, T0))
    assert d.decision == "rollback" and d.arm == "treatment"
    ev = evidence(defn, d.evaluation)
    rows = ev["hallucinations"]["treatment"]
    assert [r["stratum"] for r in rows] == ["g-new", "g-base"]
    assert rows[0]["hallucination"] == 45 and rows[0]["rated"] == 300
    assert rows[0]["hallucination_share"] == pytest.approx(45 / 47, rel=1e-5)
    assert ev["hallucinations"]["control"][0] == {
        "stratum": "g-base",
        "rated": 200,
        "hallucination": 6,
        "partial": 4,
        "hallucination_rate": 0.03,
        "hallucination_share": 0.6,
    }
