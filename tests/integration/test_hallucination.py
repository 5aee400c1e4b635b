"""The human-in-the-loop hallucination guardrail on the real broker (issue 10 part 4).

Two prompt experiments (control prompt-v1, treatment prompt-v2) guarded by one
worker, both only by ``hallucination_rate: {max_diff: 0.02}``:

- ``prompt-worse``: raters label 3 % of the control's answers and 8 % of the
  treatment's as hallucinations — rolled back on ``tailguard.releases`` with
  the human-feedback evidence (per-arm rates, difference, permutation p-value,
  n per arm, raters, strata);
- ``prompt-same``: 3 % in both arms — never rolled back.

The feedback is blind, as the gateway's rating hand-off makes it: it names
only ``request_event_id`` (no experiment, no variant), and the guard joins it
to the arm and prompt version of the request it remembers.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tailguard.simulator.feedback import SPAN_MS, batches, blind_feedback, requests

pytestmark = pytest.mark.integration

MIN = 60_000
REQUESTS = 3_000  # per experiment: ~1,500 rated requests per arm

EXPERIMENTS = """
apiVersion: tailguard/v1
kind: Experiments
experiments:
  - id: prompt-worse
    arms: [{name: control, weight: 0.5}, {name: treatment, weight: 0.5}]
    guardrails:
      hallucination_rate: {max_diff: 0.02}
    min_samples: {units: 0, requests: 100, ratings: 200}
    evaluate_every_s: 30
  - id: prompt-same
    arms: [{name: control, weight: 0.5}, {name: treatment, weight: 0.5}]
    guardrails:
      hallucination_rate: {max_diff: 0.02}
    min_samples: {units: 0, requests: 100, ratings: 200}
    evaluate_every_s: 30
"""


def test_a_five_point_hallucination_rise_is_rolled_back_and_no_change_is_not(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[..., Any],
    produce: Callable[..., Any],
    tmp_path: Path,
) -> None:
    t_begin = time.monotonic()
    exp_file = tmp_path / "experiments.yaml"
    exp_file.write_text(EXPERIMENTS)
    start = int(time.time() * 1000) - 30 * MIN
    start -= start % MIN
    rng = random.Random(10)
    worse = requests("prompt-worse", start, REQUESTS, rng)
    same = requests("prompt-same", start, REQUESTS, rng)
    worker = worker_factory(
        "halluc", "--experiments-file", str(exp_file), "--lateness-ms", "5000", ns=namespace
    ).start()
    inference = namespace.topic("tailguard.inference")
    produce(namespace.broker, inference, batches(worse, b"worse"))
    produce(namespace.broker, inference, batches(same, b"same"))
    # The requests are with the guard once the SLI agent beside it closed their minutes.
    sli = collector("tailguard.sli", ns=namespace)
    sli.wait_for(
        lambda rs: any(r["final"] and r["window_end_ms"] >= start + SPAN_MS - MIN for r in rs),
        timeout=150,
        worker=worker,
    )
    time.sleep(2.0)
    feedback = blind_feedback(worse, {"control": 0.03, "treatment": 0.08}, rng)
    feedback += blind_feedback(same, {"control": 0.03, "treatment": 0.03}, rng)
    rng.shuffle(feedback)
    produce(namespace.broker, namespace.topic("tailguard.interactions"), batches(feedback, b"fb"))
    time.sleep(2.0)
    # Later traffic moves the event time on, so the guard closes the buckets the
    # (late) feedback joined and judges them.
    tail_start = start + SPAN_MS + MIN
    produce(
        namespace.broker,
        inference,
        batches(requests("prompt-worse", tail_start, 300, rng), b"worse"),
    )
    produce(
        namespace.broker, inference, batches(requests("prompt-same", tail_start, 300, rng), b"same")
    )

    releases = collector("tailguard.releases", ns=namespace)
    releases.wait_for(
        lambda rs: any(
            r["experiment"] == "prompt-worse" and r["decision"] == "rollback" for r in rs
        ),
        timeout=150,
        worker=worker,
    )
    # prompt-same saw the same feedback and tail at the same time: once the tail's
    # minutes are final, it has been judged on all of its ratings.
    sli.wait_for(
        lambda rs: any(
            r["final"] and r["window_end_ms"] >= tail_start + SPAN_MS - 2 * MIN for r in rs
        ),
        timeout=150,
        worker=worker,
    )
    releases.poll(3)
    worker.stop()
    elapsed = time.monotonic() - t_begin
    records = releases.records

    rb = [r for r in records if r["experiment"] == "prompt-worse" and r["decision"] == "rollback"]
    assert len({r["event_id"] for r in rb}) == 1
    rb0 = rb[0]
    assert rb0["arm"] == "treatment" and rb0["weights"] == {"control": 1.0, "treatment": 0.0}
    assert "guardrail_breached:hallucination_rate.max_diff:treatment" in rb0["reason_codes"]
    assert any("human feedback" in reason for reason in rb0["reasons"]), rb0["reasons"]
    m = rb0["evidence"]["metrics"]["hallucination_rate.max_diff"]
    assert m["status"] == "breached"
    t, c = m["arms"]["treatment"], m["arms"]["control"]
    assert 0.05 < t["value"] < 0.11 and 0.01 < c["value"] < 0.05
    assert m["difference"] > 0.02 and min(m["n"].values()) >= 1_000
    test = m["test"]
    assert test["p_value"] < test["alpha_per_look"]
    assert test["raters"] == 6
    assert set(test["strata"]) == {"prompt-v1", "prompt-v2"} and test["pooled_single_arm_strata"]
    arms = rb0["evidence"]["arms"]
    assert arms["treatment"]["prompt_versions"] == {"prompt-v2": arms["treatment"]["requests"]}
    # blind feedback joined its requests (the rest of it sits in buckets after the rollback)
    assert 2_000 <= arms["treatment"]["rated"] + arms["control"]["rated"] <= REQUESTS

    same_records = [r for r in records if r["experiment"] == "prompt-same"]
    assert same_records, "prompt-same was never judged"
    assert all(r["decision"] != "rollback" for r in same_records), same_records
    assert elapsed < 240, elapsed
