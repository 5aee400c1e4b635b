"""Tenant interference and KV fragmentation on the real broker (scenario (b)).

The simulator serves three tenants on shared instances and sends every
instance's KV-cache snapshot every 5 s of event time (``--kv``). In scenario
(b) tenant ``acme`` floods ``chat/llama-3.1-8b-instruct`` at 4x its load:
the fragmentation of that model's instances rises from ~0.08 to ~0.37 and the
other tenants' P99 roughly doubles. Event time is compressed: the whole run is
produced at once (``pace="max"``) and the worker consumes it as fast as it can.

Checked: the ``interference`` breach names the victims (``globex``,
``initech``) and the neighbour (``acme``) and resolves; the KV table's figures
(read back from its changelog) equal the ground truth computed from the
snapshots the simulator sent, exactly; an hour of healthy traffic opens no
interference breach.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from tailguard.streams.interference import DeploymentState
from tailguard.streams.kv import MINUTE_MS, KvState

from tailguard.simulator import Incident, SimConfig, Target, run
from tailguard.simulator.kv import KvTracker
from tailguard.simulator.model import generate

from .conftest import read_table

pytestmark = pytest.mark.integration

MIN = 60_000
NOISY_MODEL = "llama-3.1-8b-instruct"
ONSET_MIN, END_MIN, TOTAL_MIN = 20, 32, 42
HEALTHY_MIN = 60


def scenario_b(start_ms: int) -> SimConfig:
    noisy = Incident(
        "noisy_neighbor",
        ONSET_MIN * 60.0,
        END_MIN * 60.0,
        Target(tenant="acme", model=NOISY_MODEL),
        intensity=4.0,
    )
    return SimConfig(
        rate=20.0, duration_s=TOTAL_MIN * 60.0, seed=7, start_ms=start_ms, incidents=(noisy,)
    )


def healthy(start_ms: int) -> SimConfig:
    return SimConfig(rate=20.0, duration_s=HEALTHY_MIN * 60.0, seed=3, start_ms=start_ms)


def aligned_start(minutes: int) -> int:
    """A minute-aligned start far enough back that no event lies in the future."""
    start = int(time.time() * 1000) - (minutes + 5) * MIN
    return start - start % MIN


def ground_truth(cfg: SimConfig) -> list[dict[str, Any]]:
    """The KV snapshots the simulator sends for ``cfg`` (it is deterministic)."""
    tracker = KvTracker(cfg)
    snaps: list[dict[str, Any]] = []
    for _ in tracker.watch(generate(cfg)):
        snaps.extend(tracker.due())
    snaps.extend(tracker.finish())
    return snaps


def wait_until(
    predicate: Callable[[], bool], timeout: float, worker: Any, what: str, every: float = 3.0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if not worker.alive():
            raise AssertionError(f"worker died:\n{worker.log_tail()}")
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{worker.log_tail(200)}")


def produce_run(namespace: Any, cfg: SimConfig) -> None:
    stats = run(
        cfg,
        broker=namespace.broker,
        topic=namespace.topic("tailguard.inference"),
        kv_topic=namespace.topic("tailguard.kv"),
        pace="max",
    )
    assert stats.failed_messages == 0, stats.last_error
    assert stats.kv_snapshots > 0


def evaluated_through(namespace: Any) -> dict[str, int]:
    """``service|model`` → the last minute the detector evaluated (from its changelog)."""
    table = read_table(namespace.broker, f"{namespace.app_id}-tailguard-interference-changelog")
    out = {}
    for key, raw in table.items():
        if key.startswith(b"D\x1f"):
            state = DeploymentState.from_bytes(raw)
            if state.evaluated_ms is not None:
                out[state.key] = state.evaluated_ms
    return out


def interference(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == "interference"]


def exact_minute(snaps: list[dict[str, Any]]) -> dict[str, int]:
    """Integer sums of one minute's snapshots (what a KvMinute holds)."""
    tokens = sum(q["tokens"] for s in snaps for q in s["sequences"])
    block_tokens = sum(q["blocks"] * s["block_size"] for s in snaps for q in s["sequences"])
    used = sum(s["total_blocks"] - s["free_blocks"] for s in snaps)
    total = sum(s["total_blocks"] for s in snaps)
    return {"tokens": tokens, "block_tokens": block_tokens, "used": used, "total": total}


def test_scenario_b_names_victims_and_neighbour_and_kv_figures_are_exact(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[..., Any],
) -> None:
    start = aligned_start(TOTAL_MIN)
    cfg = scenario_b(start)
    worker = worker_factory("w1").start()
    produce_run(namespace, cfg)
    breaches = collector("tailguard.breaches")

    def resolved_both(records: list[dict[str, Any]]) -> bool:
        done = {r["victim"] for r in interference(records) if r["state"] == "resolved"}
        return {"globex", "initech"} <= done

    breaches.wait_for(resolved_both, timeout=300, worker=worker)
    found = interference(breaches.records)
    onset, end = start + ONSET_MIN * MIN, start + END_MIN * MIN

    # --- the right victims and neighbour, on the right deployment, in the incident
    assert {r["victim"] for r in found} == {"globex", "initech"}, found
    for r in found:
        assert r["series"]["service"] == "chat" and r["series"]["model"] == NOISY_MODEL
        assert r["series"]["tenant"] == r["victim"]
        assert r["neighbours"][0] == "acme", r["summary"]
        assert r["attribution"][0]["tenant"] == "acme" and r["attribution"][0]["share"] > 0.5
        assert r["kind"] == "interference" and r["schema"] == "tailguard.breach.v1"
    opened = [r for r in found if r["state"] == "opened"]
    assert sorted(r["victim"] for r in opened) == ["globex", "initech"], "one breach per victim"
    for r in opened:
        assert onset < r["at_ms"] <= onset + 10 * MIN, (r["at_ms"] - onset) / MIN
        ev = r["sli"]
        assert ev["victim_p99_ratio"][ev["metric"]] >= 1.5
        assert ev["victim_load_ratio"] <= 1.25
        assert r["attribution"][0]["load_ratio"] >= 1.5
        shared = {row["instance"] for row in ev["shared_instances"]}
        assert shared and all(i.startswith(f"chat-{NOISY_MODEL}-") for i in shared)
        assert ev["fragmentation"] >= 0.2 and ev["fragmentation_baseline"] < 0.1
        assert r["summary"].startswith(f"chat/{NOISY_MODEL} tenant {r['victim']}")
    for r in (r for r in found if r["state"] == "resolved"):
        assert end < r["at_ms"] <= end + 10 * MIN
    ids = {r["victim"]: r["breach_id"] for r in opened}
    assert all(r["breach_id"] == ids[r["victim"]] for r in found), "stable breach_id"

    # --- the breach's fragmentation evidence equals the snapshots' ground truth
    truth = ground_truth(cfg)
    by_minute: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for s in truth:
        end_ms = s["ts_ms"] - s["ts_ms"] % MINUTE_MS + MINUTE_MS
        by_minute.setdefault((s["instance"], end_ms), []).append(s)
    for r in opened:
        at = r["at_ms"]
        for row in r["sli"]["shared_instances"]:
            window = [
                s
                for m in range(at - 2 * MINUTE_MS, at + 1, MINUTE_MS)
                for s in by_minute.get((row["instance"], m), [])
            ]
            sums = exact_minute(window)
            assert row["fragmentation"] == 1.0 - sums["tokens"] / sums["block_tokens"]

    # --- the KV table (from its changelog) holds exactly the snapshots' figures
    last = {s["instance"]: s for s in truth}
    changelog = f"{namespace.app_id}-tailguard-kv-changelog"
    states: dict[str, KvState] = {}

    def table_caught_up() -> bool:
        states.clear()
        for key, raw in read_table(namespace.broker, changelog).items():
            states[key.decode()] = KvState.from_bytes(raw)
        return set(states) == set(last) and all(
            st.latest is not None and st.latest.ts_ms == last[name]["ts_ms"]
            for name, st in states.items()
        )

    wait_until(table_caught_up, 120, worker, "the KV table to hold the last snapshots")
    for name, st in states.items():
        snap = last[name]
        fig = st.latest
        assert fig is not None
        tokens = sum(q["tokens"] for q in snap["sequences"])
        blocks = sum(q["blocks"] for q in snap["sequences"])
        assert (fig.tokens, fig.blocks, fig.sequences) == (tokens, blocks, len(snap["sequences"]))
        assert fig.fragmentation == (
            1.0 - tokens / (blocks * snap["block_size"]) if blocks else None
        )
        assert fig.utilisation == 1.0 - snap["free_blocks"] / snap["total_blocks"]
        assert fig.preemptions == snap["preemptions"]
        assert st.minutes, "a minute history is kept"
        for minute in st.minutes:
            sums = exact_minute(by_minute[(name, minute.end_ms)])
            assert minute.snapshots == len(by_minute[(name, minute.end_ms)])
            assert (minute.tokens, minute.block_tokens) == (sums["tokens"], sums["block_tokens"])
            assert (minute.used_blocks, minute.total_blocks) == (sums["used"], sums["total"])
            assert minute.fragmentation == 1.0 - sums["tokens"] / sums["block_tokens"]
    peak = max(
        m.fragmentation or 0.0
        for name, st in states.items()
        if name.startswith(f"chat-{NOISY_MODEL}-")
        for m in st.minutes
    )
    calm = [
        m.fragmentation
        for name, st in states.items()
        if not name.startswith(f"chat-{NOISY_MODEL}-")
        for m in st.minutes
        if m.fragmentation is not None
    ]
    assert 0.33 <= peak <= 0.40, peak
    assert calm and all(0.06 <= f <= 0.10 for f in calm)
    worker.stop()


def test_a_healthy_hour_opens_no_interference_breach(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[..., Any],
) -> None:
    start = aligned_start(HEALTHY_MIN)
    worker = worker_factory("w1").start()
    produce_run(namespace, healthy(start))
    # The detector has judged (nearly) the whole hour of every deployment: the last
    # minutes stay open (the SLI agent's allowed lateness) and the readiness rule
    # waits for every series.
    through = start + (HEALTHY_MIN - 5) * MIN
    deployments = {
        "chat|llama-3.1-8b-instruct",
        "chat|llama-3.1-70b-instruct",
        "search-rag|qwen2-7b-instruct",
    }

    def judged() -> bool:
        done = evaluated_through(namespace)
        return set(done) == deployments and min(done.values()) >= through

    wait_until(judged, 300, worker, "the detector to evaluate the hour")
    breaches = collector("tailguard.breaches")
    breaches.poll(5)
    assert interference(breaches.records) == []
    worker.stop()
