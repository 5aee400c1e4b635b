"""The prompt-experiment simulator: requests per arm, blind ratings with each arm's rate."""

import json
import random
from collections import Counter

import pytest

from tailguard.simulator.feedback import SPAN_MS, batches, blind_feedback, requests, trace_id

T0_MS = 1_699_995_600_000
VERSIONS = {"control": "support-v1", "treatment": "support-v3"}


def make(n: int = 20_000, seed: int = 10, **kw):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    reqs = requests("prompt-v3", T0_MS, n, rng, versions=VERSIONS, **kw)
    return reqs, blind_feedback(reqs, {"control": 0.03, "treatment": 0.08}, rng)


def test_the_same_seed_gives_the_same_requests_and_ratings() -> None:
    assert make(500) == make(500)
    assert make(500) != make(500, seed=11)


def test_each_arm_is_served_its_prompt_version_with_a_trace_over_the_span() -> None:
    reqs, _ = make(1_000)
    assert {r["variant"]: r["prompt_version"] for r in reqs} == VERSIONS
    assert all(r["trace_id"] == trace_id(r["event_id"]) and len(r["trace_id"]) == 32 for r in reqs)
    assert reqs[0]["ts_ms"] == T0_MS and reqs[-1]["ts_ms"] < T0_MS + SPAN_MS
    assert len({r["event_id"] for r in reqs}) == len(reqs)
    assert 0.45 < Counter(r["variant"] for r in reqs)["treatment"] / len(reqs) < 0.55


def test_hallucination_rates_per_arm_are_as_configured() -> None:
    reqs, feedback = make()
    arm = {r["event_id"]: r["variant"] for r in reqs}
    rated, bad = Counter(), Counter()
    for f in feedback:
        a = arm[f["request_event_id"]]
        rated[a] += 1
        bad[a] += f["label"] == "hallucination"
    assert bad["control"] / rated["control"] == pytest.approx(0.03, abs=0.006)
    assert bad["treatment"] / rated["treatment"] == pytest.approx(0.08, abs=0.008)
    assert Counter(f["label"] for f in feedback)["partial"] / len(feedback) == pytest.approx(
        0.05, abs=0.008
    )
    assert {f["rater"] for f in feedback} == {f"rater-{i}" for i in range(6)}


def test_feedback_is_blind_it_names_only_the_request() -> None:
    _, feedback = make(200)
    for f in feedback:
        assert f["kind"] == "feedback" and f["label"] in {"correct", "partial", "hallucination"}
        assert not {"experiment", "variant", "experiments", "prompt_version", "unit_id"} & f.keys()
        assert f["request_event_id"].startswith("prompt-v3-")


def test_slow_share_makes_that_share_of_requests_bad_and_none_without_it() -> None:
    slow = [r for r in make(5_000, slow_share=0.02)[0] if r["ttft_ms"] > 800]
    assert 60 < len(slow) < 140
    assert not [r for r in make(5_000)[0] if r["ttft_ms"] > 800]


def test_bad_options_are_refused_with_what_was_wrong() -> None:
    rng = random.Random(1)
    with pytest.raises(ValueError, match="control and treatment"):
        requests("x", T0_MS, 1, rng, versions={"a": "v1", "b": "v2"})
    with pytest.raises(ValueError, match="slow_share"):
        requests("x", T0_MS, 1, rng, slow_share=1.5)


def test_batches_cut_events_into_json_arrays_under_one_key() -> None:
    reqs, _ = make(450)
    out = batches(reqs, b"k")
    assert len(out) == 3 and {k for k, _ in out} == {b"k"}
    assert [len(json.loads(v)) for _, v in out] == [200, 200, 50]
