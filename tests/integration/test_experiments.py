"""The A/B and gray-release guard on the real broker: canary rollback, A/A, SRM.

One worker guards three experiments at once (one worker start keeps the
test lean on a 2-core machine):

- ``canary``: the simulator's ``prompt_cache_miss`` incident — the treatment
  ships prompt_version v2 whose prefix-cache hit rate collapses, TTFT rises;
  offline ROUGE-L of the treatment is better (so the rollback must also say
  "misaligned"). Exactly one rollback, with evidence, even after the worker
  is SIGKILLed right after it and replays its input.
- ``aa``: the same traffic without the incident, with interactions (IR/SC):
  no rollback ever.
- ``srm``: 2,000 units split 60/40 against a planned 50/50: hold, never promote.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tailguard.simulator.config import Incident, ModelSpec, ServiceSpec, SimConfig
from tailguard.simulator.model import generate

pytestmark = pytest.mark.integration

MIN = 60_000
SPAN_S = 600.0

EXPERIMENTS = """
apiVersion: tailguard/v1
kind: Experiments
experiments:
  - id: canary
    arms: [{name: control, weight: 0.5}, {name: treatment, weight: 0.5}]
    guardrails:
      ttft_p95: {max_ratio: 1.10}
      itl_p99: {max_ratio: 1.10}
      e2e_p95: {max_ratio: 1.10}
      success_rate: {min: 0.992}
    min_samples: {units: 50, requests: 500}
    evaluate_every_s: 30
  - id: aa
    arms: [control, treatment]
    guardrails:
      ttft_p95: {max_ratio: 1.10}
      itl_p99: {max_ratio: 1.10}
      e2e_p95: {max_ratio: 1.10}
      success_rate: {min: 0.992}
      interruption_rate: {max_diff: 0.02}
      session_completion: {min_diff: -0.02}
    min_samples: {units: 50, requests: 500, sessions: 100}
    evaluate_every_s: 30
  - id: srm
    arms: [control, treatment]
    guardrails:
      ttft_p95: {max_ratio: 1.10}
    min_samples: {units: 50, requests: 500}
    evaluate_every_s: 30
"""


def sim(experiment: str, start_ms: int, seed: int, incidents: tuple[Incident, ...]) -> list[Any]:
    cfg = SimConfig(
        rate=12.0,
        duration_s=SPAN_S,
        seed=seed,
        services=(ServiceSpec(name="chat", models=(ModelSpec(name="llama-8b"),)),),
        tenants=("acme", "globex"),
        experiment=experiment,
        start_ms=start_ms,
        incidents=incidents,
    )
    return list(generate(cfg))


def srm_events(start_ms: int) -> list[dict[str, Any]]:
    """2,000 units, 60 % of them in control; latencies from one distribution."""
    base = sim("srm", start_ms, 99, ())
    out = []
    for i, ev in enumerate(base[:2000]):
        ev = dict(ev)
        ev["unit_id"] = f"srm-u{i}"
        ev["variant"] = "control" if i % 5 < 3 else "treatment"
        out.append(ev)
    return out


def interactions(events: list[dict[str, Any]], experiment: str) -> list[dict[str, Any]]:
    """One end per session (80 % complete), one in 20 sessions interrupted first."""
    sessions: dict[str, dict[str, Any]] = {}
    for ev in events:
        sessions[ev["session_id"]] = ev
    out = []
    for i, (sid, ev) in enumerate(sorted(sessions.items())):
        common = {
            "service": ev["service"],
            "unit_id": ev["unit_id"],
            "session_id": sid,
            "experiment": experiment,
            "variant": ev["variant"],
        }
        if i % 20 == 0:
            out.append(
                {"event_id": f"{sid}-i", "ts_ms": ev["ts_ms"] + 500, "kind": "interrupt", **common}
            )
        kind = "session_complete" if i % 5 else "session_abandon"
        out.append({"event_id": f"{sid}-e", "ts_ms": ev["ts_ms"] + 1000, "kind": kind, **common})
    return out


def batches(events: list[dict[str, Any]], key: bytes, size: int = 200) -> list[tuple[bytes, bytes]]:
    return [(key, json.dumps(events[i : i + size]).encode()) for i in range(0, len(events), size)]


def rollbacks(records: list[dict[str, Any]], experiment: str) -> list[dict[str, Any]]:
    return [r for r in records if r["experiment"] == experiment and r["decision"] == "rollback"]


def test_canary_rolls_back_once_aa_never_and_srm_holds(
    monkeypatch: pytest.MonkeyPatch,
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[..., Any],
    produce: Callable[..., Any],
    tmp_path: Path,
) -> None:
    # The restarted worker rejoins while the killed one is still in the group: detect
    # the dead member after 10 s instead of faust's 60 s (as test_recovery does).
    monkeypatch.setenv("BROKER_SESSION_TIMEOUT", "10")
    exp_file = tmp_path / "experiments.yaml"
    exp_file.write_text(EXPERIMENTS)
    start = int(time.time() * 1000) - 20 * MIN
    start -= start % MIN
    canary = sim("canary", start, 5, (Incident("prompt_cache_miss", 0.0, SPAN_S),))
    aa = sim("aa", start, 6, ())
    srm = srm_events(start)
    worker = worker_factory(
        "exp", "--experiments-file", str(exp_file), "--lateness-ms", "5000", ns=namespace
    ).start()
    inference = namespace.topic("tailguard.inference")
    produce(namespace.broker, inference, batches(canary, b"canary"))
    produce(namespace.broker, inference, batches(aa, b"aa"))
    produce(namespace.broker, inference, batches(srm, b"srm"))
    produce(
        namespace.broker,
        namespace.topic("tailguard.interactions"),
        batches(interactions(aa, "aa"), b"aa", size=100),
    )
    evals = [
        {"ts_ms": start, "experiment": "canary", "variant": v, "metric": "rouge_l", "value": x}
        for v, x in (("control", 0.381), ("treatment", 0.412))
    ]
    produce(
        namespace.broker,
        namespace.topic("tailguard.evals"),
        [(b"canary", json.dumps(e).encode()) for e in evals],
    )

    releases = collector("tailguard.releases", ns=namespace)

    def settled(rs: list[dict[str, Any]]) -> bool:
        return (
            bool(rollbacks(rs, "canary"))
            and any(r["experiment"] == "srm" and r["decision"] == "hold" for r in rs)
            and any(r["experiment"] == "aa" for r in rs)
        )

    releases.wait_for(settled, timeout=240, worker=worker)
    # Crash right after the rollback and restart: the input since the last commit is
    # replayed; the rollback may be re-sent (same event_id), never decided again.
    worker.kill()
    worker.start()
    later = start + int(SPAN_S * 1000)
    more = sim("canary", later, 7, (Incident("prompt_cache_miss", 0.0, 180.0),))
    produce(namespace.broker, inference, batches(more[:2000], b"canary"))
    last_aa = aa[-1]["ts_ms"]
    # The restarted worker has processed the new input once it publishes final SLI
    # snapshots of its minutes (the experiment agent runs beside the SLI agent).
    sli = collector("tailguard.sli", ns=namespace)
    sli.wait_for(
        lambda rs: any(r["final"] and r["window_end_ms"] >= later + 2 * MIN for r in rs),
        timeout=240,
        worker=worker,
    )
    releases.poll(5)
    worker.stop()
    records = releases.records
    assert all(h for h in releases.headers)

    # canary: exactly one rollback (deduplicated by event_id), with its evidence
    canary_rb = rollbacks(records, "canary")
    assert len({r["event_id"] for r in canary_rb}) == 1, canary_rb
    rb = canary_rb[0]
    assert rb["schema"] == "tailguard.release.v1" and rb["arm"] == "treatment"
    assert rb["weights"] == {"control": 1.0, "treatment": 0.0}
    ttft = rb["evidence"]["metrics"]["ttft_p95.max_ratio"]
    assert ttft["status"] == "breached"
    assert ttft["interval"][0] > 1.10 and ttft["ratio"] > 1.10
    assert ttft["p_value"] < ttft["alpha"]
    assert set(ttft["arms"]) == {"control", "treatment"}
    assert min(ttft["n"].values()) >= 500
    assert ttft["difference"] > 0
    codes = rb["reason_codes"]
    assert "guardrail_breached:ttft_p95.max_ratio:treatment" in codes
    assert "polluted:prefix_cache_miss:treatment" in codes, codes
    assert "misaligned:rouge_l:treatment" in codes, codes
    arms = rb["evidence"]["arms"]
    assert arms["treatment"]["cache_hit_rate"] < 0.3 < 0.9 < arms["control"]["cache_hit_rate"]
    assert arms["treatment"]["prompt_versions"] == {"v2": arms["treatment"]["requests"]}
    # prompt evidence: v2 holds the treatment's bad requests, with their trace ids
    top = rb["evidence"]["prompts"]["treatment"][0]
    bad_v2 = {
        ev["trace_id"]
        for ev in canary + more
        if ev["variant"] == "treatment"
        and ev["prompt_version"] == "v2"
        and (
            ev["status"] in ("error", "timeout", "rejected")
            or (ev["status"] == "ok" and (ev.get("ttft_ms") or 0.0) > 800.0)
        )
    }
    assert top["prompt_version"] == "v2" and top["bad"] > 0 and top["bad_share"] == 1.0
    assert len(top["exemplars"]) == 3 and set(top["exemplars"]) <= bad_v2
    assert rb["evidence"]["prompt_groups"]["treatment"][0]["versions"] == ["v2"]
    assert rb["evidence"]["bad_requests"]["counts"]["treatment"] == top["bad"]
    headers = dict(releases.headers[records.index(rb)])
    assert headers["ce_type"] == b"tailguard.release.v1"
    assert headers["ce_id"] == rb["event_id"].encode()
    # nothing after the rollback: the experiment is closed for this generation
    canary_all = [r for r in records if r["experiment"] == "canary"]
    assert canary_all[-1]["event_id"] == rb["event_id"]

    # aa: never rolled back, and its interactions were counted
    aa_records = [r for r in records if r["experiment"] == "aa"]
    assert aa_records and not rollbacks(records, "aa")
    assert all(r["decision"] in ("continue", "promote") for r in aa_records), aa_records
    assert last_aa > start

    # srm: hold with the SRM evidence, never promote or roll back
    srm_records = [r for r in records if r["experiment"] == "srm"]
    assert not [r for r in srm_records if r["decision"] in ("promote", "rollback")]
    hold = next(r for r in srm_records if r["decision"] == "hold")
    assert "srm" in hold["reason_codes"]
    s = hold["evidence"]["srm"]
    assert s["flagged"] and s["p_value"] < 0.001 and s["p_value_sequential"] < 0.001

    # every decision is in the audit trail
    audit = collector("tailguard.audit", ns=namespace)
    audit.poll(5)
    refs = {
        a["args"]["release_event_id"]
        for a in audit.records
        if a.get("kind") == "decision" and str(a.get("action", "")).startswith("release.")
    }
    assert {r["event_id"] for r in records} <= refs
