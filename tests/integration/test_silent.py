"""Silent SLO collapse on the real broker: detection, attribution, resolution, no false alarms.

The simulator's ``silent_collapse`` incident is the article's chain (flow
control at 128 tokens/s, prefix-cache hit rate 98.7 % → ~7 %, a batcher with
``min_batch`` 4 / 350 ms timeout / 50 ms backoff): QPS unchanged, no error.
Event time is compressed: the whole run is produced at once and the worker
consumes it as fast as it can.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from tailguard.streams.attribution import BATCH_WAIT_MS, CACHE_MISS_BELOW

from tailguard.simulator.config import Incident, ModelSpec, ServiceSpec, SimConfig, Target
from tailguard.simulator.model import generate

pytestmark = pytest.mark.integration

MIN = 60_000
ONSET_MIN = 25
END_MIN = 35
TOTAL_MIN = 50


def one_series_config(start_ms: int, incidents: tuple[Incident, ...]) -> SimConfig:
    return SimConfig(
        rate=6.0,
        duration_s=TOTAL_MIN * 60.0,
        seed=11,
        services=(ServiceSpec(name="chat", models=(ModelSpec(name="llama-70b"),)),),
        tenants=("acme",),
        variants=("control",),
        experiment=None,
        start_ms=start_ms,
        incidents=incidents,
    )


def messages(events: list[dict[str, Any]], per_message: int = 300) -> list[tuple[bytes, bytes]]:
    # One key, one input partition: events stay in event-time order (see test_breaches).
    return [
        (b"sim", json.dumps(events[i : i + per_message]).encode())
        for i in range(0, len(events), per_message)
    ]


def violating(ev: dict[str, Any]) -> bool:
    """Ok and over a default latency threshold (TTFT 800 ms, TPOT 120 ms)."""
    if ev["status"] != "ok":
        return False
    ttft = ev.get("ttft_ms")
    tokens = ev.get("output_tokens") or 0
    tpot = (ev["e2e_ms"] - ttft) / (tokens - 1) if ttft is not None and tokens > 1 else 0.0
    return (ttft is not None and ttft > 800.0) or tpot > 120.0


def truth(ev: dict[str, Any]) -> dict[str, bool]:
    """The simulator's record of what happened to a request, read from its own fields."""
    cache, batch, flow = ev.get("cache") or {}, ev.get("batch") or {}, ev.get("flow_control") or {}
    query = cache.get("prefix_query_tokens", 0)
    return {
        "prefix_cache_miss": query > 0
        and cache.get("prefix_hit_tokens", 0) < CACHE_MISS_BELOW * query,
        "batch_wait": bool(batch.get("timed_out"))
        or (batch.get("wait_ms") or 0.0) >= BATCH_WAIT_MS,
        "throttled": bool(flow.get("throttled")),
    }


def run(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[..., Any],
    produce: Callable[..., Any],
    events: list[dict[str, Any]],
    done: Callable[[list[dict[str, Any]]], bool],
    name: str,
) -> list[dict[str, Any]]:
    worker = worker_factory(name, ns=namespace).start()
    produce(namespace.broker, namespace.topic("tailguard.inference"), messages(events))
    breaches = collector("tailguard.breaches", ns=namespace)
    sli = collector("tailguard.sli", ns=namespace)
    last_end = events[-1]["ts_ms"] - events[-1]["ts_ms"] % MIN
    sli.wait_for(
        lambda rs: any(r["final"] and r["window_end_ms"] >= last_end - 3 * MIN for r in rs),
        timeout=240,
        worker=worker,
    )
    if not done(breaches.records):
        breaches.wait_for(done, timeout=60, worker=worker)
    time.sleep(2)
    breaches.poll(2)
    worker.stop()
    return breaches.records


def test_the_articles_silent_collapse_is_caught_explained_and_resolved(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[..., Any],
    produce: Callable[..., Any],
) -> None:
    start = int(time.time() * 1000) - (TOTAL_MIN + 5) * MIN
    start -= start % MIN
    onset = start + ONSET_MIN * MIN
    incident = Incident("silent_collapse", ONSET_MIN * 60.0, END_MIN * 60.0, Target(service="chat"))
    events = list(generate(one_series_config(start, (incident,))))
    # The incident is silent by construction: no more errors, the same rate.
    before = [e for e in events if onset - 10 * MIN <= e["ts_ms"] < onset]
    during = [e for e in events if onset <= e["ts_ms"] < onset + 10 * MIN]
    assert abs(len(during) / len(before) - 1) < 0.15

    def resolved(rs: list[dict[str, Any]]) -> bool:
        return any(r["kind"] == "silent_degradation" and r["state"] == "resolved" for r in rs)

    records = run(namespace, worker_factory, collector, produce, events, resolved, "silent")
    silent = [r for r in records if r["kind"] == "silent_degradation"]
    states = [r["state"] for r in silent]
    assert states[0] == "opened" and states[-1] == "resolved", states
    assert states.count("opened") == 1 and len({r["breach_id"] for r in silent}) == 1
    opened = silent[0]
    assert onset < opened["at_ms"] <= onset + 2 * MIN, "opens within 2 minutes of the onset"
    assert opened["series"]["service"] == "chat"
    sli = opened["sli"]
    assert sli["attainment"] < sli["baseline_attainment"] - 0.05
    assert sli["p95_ttft_ms"] > 1.5 * sli["baseline_p95_ttft_ms"]
    assert opened["resolved_ms"] is None
    assert silent[-1]["resolved_ms"] > onset + (END_MIN - ONSET_MIN) * MIN

    # Attribution: cache miss, then batch wait, with the simulator's shares (±10 points)
    # over the same 5-minute window the breach was judged on.
    causes = [c["cause"] for c in opened["attribution"]]
    assert causes[:2] == ["prefix_cache_miss", "batch_wait"], opened["attribution"]
    window = [e for e in events if opened["at_ms"] - 5 * MIN <= e["ts_ms"] < opened["at_ms"]]
    bad = [truth(e) for e in window if violating(e)]
    assert len(bad) > 50
    for cause in opened["attribution"]:
        expected = sum(t[cause["cause"]] for t in bad) / len(bad)
        assert abs(cause["share"] - expected) <= 0.10, (cause, expected)
    miss = opened["attribution"][0]
    assert miss["lift"] > 10 and miss["ttft_affected_ms"] > miss["ttft_unaffected_ms"]
    # Stage attribution: the stages that grew the most, prefill or queue first.
    stages = [s["stage"] for s in opened["stages"]]
    assert len(stages) == 3 and stages[0] in {"prefill", "queue"}, opened["stages"]


def test_errors_rising_with_latency_is_an_ordinary_breach_not_a_silent_one(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[..., Any],
    produce: Callable[..., Any],
) -> None:
    start = int(time.time() * 1000) - (TOTAL_MIN + 5) * MIN
    start -= start % MIN
    target = Target(service="chat")
    incidents = (
        Incident("silent_collapse", ONSET_MIN * 60.0, END_MIN * 60.0, target),
        Incident("error_burst", ONSET_MIN * 60.0, END_MIN * 60.0, target, intensity=0.15),
    )
    events = list(generate(one_series_config(start, incidents)))

    def loud(rs: list[dict[str, Any]]) -> bool:
        return any(r["kind"] == "burn_rate" for r in rs)

    records = run(namespace, worker_factory, collector, produce, events, loud, "loud")
    kinds = {r["kind"] for r in records}
    assert "burn_rate" in kinds
    assert "silent_degradation" not in kinds
    onset = start + ONSET_MIN * MIN
    opened = [r for r in records if r["kind"] == "burn_rate" and r["state"] == "opened"]
    assert opened and all(onset < r["at_ms"] <= onset + 5 * MIN for r in opened), [
        (r["slo"], r["at_ms"] - onset) for r in opened
    ]
    latency = [r for r in opened if r["slo"] != "success-rate"]
    assert latency and all(r["attribution"] for r in latency), "latency breaches are explained"


def test_a_healthy_hour_raises_no_silent_or_interference_breach(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[..., Any],
    produce: Callable[..., Any],
) -> None:
    start = int(time.time() * 1000) - 70 * MIN
    start -= start % MIN
    cfg = SimConfig(rate=20.0, duration_s=3_600.0, seed=5, start_ms=start)  # the default fleet
    events = list(generate(cfg))
    records = run(namespace, worker_factory, collector, produce, events, lambda rs: True, "healthy")
    assert not [r for r in records if r["kind"] in {"silent_degradation", "interference"}]
