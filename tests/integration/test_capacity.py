"""Capacity on the real broker: load ramp across the knee, a failing MoE expert, a drifting index.

One worker consumes three deployments at once (event time compressed: the whole
run is produced up front):

- ``chat/ramp``: concurrency ramps 1 → 13 (knee at 8: flat latency up to it,
  a steep rise after), holds, ramps down to 2 and stays low; GPU samples say
  20 % utilisation and 50 % memory. Expected: one scale-up near 1.2 × knee,
  one scale-down after the ramp down, nothing else (no flapping).
- ``chat/moe``: expert 5 fails 40 % of its requests from its 100th request to
  its 250th. Expected: its breaker opens within 100 of its requests and closes
  after recovery (through half-open).
- ``chat/rag``: index ``kb`` drifts from Beta(18, 3) to Beta(8, 5) top-1
  similarities. Expected: the threshold moves down, every change lower than
  the one before.

All with the default tuning (no ``TAILGUARD_CAPACITY``). The second test cuts
the same scenarios in three and restarts the worker between the parts — once
on its own data directory, once on a new one (the state comes back from the
changelog) — and expects the records of an uninterrupted run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from tailguard.streams.capacity_state import decode_knee
from tailguard.streams.knee import KneeConfig

from tailguard.simulator import capacity as cap

from .conftest import read_table

pytestmark = pytest.mark.integration

KNEE = cap.KNEE
T0 = (int(time.time() * 1000) // 3_600_000 - 3) * 3_600_000  # hour-aligned, 3 h ago


def messages(events: list[dict[str, Any]], key: bytes) -> list[tuple[bytes, bytes]]:
    return [(key, json.dumps(events[i : i + 200]).encode()) for i in range(0, len(events), 200)]


def of(records: list[dict[str, Any]], model: str, kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["deployment"]["model"] == model and r["kind"] == kind]


def actions(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in of(records, "ramp", "scale") if r["decision"] != "hold"]


def test_ramp_failing_expert_and_drifting_index(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[..., Any],
    produce: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TAILGUARD_CAPACITY", raising=False)  # the defaults
    now = int(time.time() * 1000)
    gpu = [(b"h1:0", json.dumps(cap.gpu_sample(now)).encode())]
    produce(namespace.broker, namespace.topic("tailguard.gpu"), gpu)
    out = collector("tailguard.capacity")
    audit = collector("tailguard.audit")
    worker = worker_factory().start()
    time.sleep(8)  # the worker's GPU cache reads the sample before the ramp's intervals close
    topic = namespace.topic("tailguard.inference")
    for model, events in cap.capacity_scenarios(T0).items():
        produce(namespace.broker, topic, messages(events, model.encode()))

    def done(records: list[dict[str, Any]]) -> bool:
        scale = [r for r in of(records, "ramp", "scale") if r["decision"] != "hold"]
        closed = [r for r in of(records, "moe", "breaker") if r["decision"] == "closed"]
        return len(scale) >= 2 and bool(closed) and len(of(records, "rag", "rag_threshold")) >= 2

    out.wait_for(done, timeout=180, worker=worker)
    out.poll(3)
    recs = out.records
    assert all(r["schema"] == "tailguard.capacity.v1" for r in recs)
    assert len({r["event_id"] for r in recs}) == len(recs)
    assert all(dict(h).get("ce_type") == b"tailguard.capacity.v1" for h in out.headers)

    # Ramp: exactly one scale-up near 1.2 × knee, then exactly one scale-down.
    knees = of(recs, "ramp", "knee")
    assert knees and abs(knees[-1]["evidence"]["knee_concurrency"] - KNEE) <= 0.15 * KNEE
    actions = [r for r in of(recs, "ramp", "scale") if r["decision"] != "hold"]
    assert [r["decision"] for r in actions] == ["scale_up", "scale_down"], actions
    up, down = actions
    assert 1.2 * KNEE * 0.9 <= up["evidence"]["concurrency"] <= 1.2 * KNEE * 1.5
    assert down["evidence"]["concurrency"] < 0.6 * up["evidence"]["knee"]
    assert down["evidence"]["util_pct"] == 20.0 and down["evidence"]["mem_fraction"] == 0.5
    warm = of(recs, "ramp", "warmup")
    assert warm and warm[0]["decision"] == "effective"
    assert warm[0]["evidence"]["before_ttft_p50_ms"] == 1200.0

    # Failing expert 5: opens within 100 of its failing-phase requests, closes after recovery.
    moves = [r for r in of(recs, "moe", "breaker") if r["expert"] == 5]
    assert moves[0]["decision"] == "open"
    assert moves[0]["evidence"]["requests_seen"] - 100 <= 100
    assert moves[0]["evidence"]["fallback_share"] > 0
    assert moves[-1]["decision"] == "closed" and moves[-1]["evidence"]["before"] == "half_open"
    assert all(r["expert"] == 5 for r in of(recs, "moe", "breaker"))

    # Drifting index: the threshold goes down, one step after another (no noise).
    rag = of(recs, "rag", "rag_threshold")
    assert rag[0]["decision"] == "initial" and rag[0]["index"] == "kb"
    assert rag[-1]["evidence"]["threshold"] < rag[0]["evidence"]["threshold"] - 0.1
    assert [r["decision"] for r in rag[1:]] == ["lowered"] * (len(rag) - 1), rag
    assert all(r["evidence"]["band"] >= r["evidence"]["tolerance"] for r in rag[1:])

    # Every publication is audited.
    audit.wait_for(
        lambda rs: sum(str(r.get("action", "")).startswith("capacity.") for r in rs) >= len(recs),
        timeout=30,
    )


def _cut(events: list[dict[str, Any]], *cuts_s: float) -> list[list[dict[str, Any]]]:
    """``events`` in parts by event time: before T0 + cut₁, before T0 + cut₂, …, the rest."""
    parts: list[list[dict[str, Any]]] = [[] for _ in range(len(cuts_s) + 1)]
    for e in events:
        parts[sum(e["ts_ms"] >= T0 + c * 1000 for c in cuts_s)].append(e)
    return parts


def test_knee_episode_breaker_and_threshold_survive_restarts(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[..., Any],
    produce: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Part A → stop → same data dir, part B → stop → new data dir, part C.

    Cuts: the ramp after its scale_up (275 s) and in its ramp down (400 s); the
    failing expert after its breaker opened (70 s) and while it is open again
    (100 s); the index after its first threshold (100 s) and as it drifts (200 s).
    A worker that forgot its state would learn the knee again, close the breaker
    (and open it anew from closed), and publish a second ``initial`` threshold.
    """
    monkeypatch.delenv("TAILGUARD_CAPACITY", raising=False)
    now = int(time.time() * 1000)
    produce(
        namespace.broker,
        namespace.topic("tailguard.gpu"),
        [(b"h1:0", json.dumps(cap.gpu_sample(now)).encode())],
    )
    out = collector("tailguard.capacity")
    topic = namespace.topic("tailguard.inference")
    scen = cap.capacity_scenarios(T0)
    cuts = {"ramp": (275, 400), "moe": (70, 100), "rag": (100, 200)}
    parts = {model: _cut(events, *cuts[model]) for model, events in scen.items()}

    def feed(i: int) -> None:
        for model in scen:
            produce(namespace.broker, topic, messages(parts[model][i], model.encode()))

    def expert5(records: list[dict[str, Any]]) -> list[str]:
        return [r["decision"] for r in of(records, "moe", "breaker") if r["expert"] == 5]

    # A: the overload is answered, the breaker opens, the first threshold is out.
    worker = worker_factory("w1").start()
    time.sleep(8)
    feed(0)
    out.wait_for(
        lambda rs: (
            bool(actions(rs))
            and expert5(rs) == ["open"]
            and len(of(rs, "rag", "rag_threshold")) == 1
        ),
        timeout=120,
        worker=worker,
    )
    assert worker.stop() == 0
    # B: the same worker, restarted on its data directory.
    worker = worker_factory("w1").start()
    feed(1)
    out.wait_for(
        lambda rs: expert5(rs) == ["open", "half_open", "open"], timeout=120, worker=worker
    )
    out.poll(5)
    assert [r["decision"] for r in actions(out.records)] == ["scale_up"], actions(out.records)
    assert worker.stop() == 0
    # C: a new worker on a new data directory: the state comes from the changelog.
    worker = worker_factory("w2").start()
    feed(2)

    def done(rs: list[dict[str, Any]]) -> bool:
        return len(actions(rs)) >= 2 and expert5(rs)[-1:] == ["closed"]

    out.wait_for(done, timeout=180, worker=worker)
    out.poll(5)
    recs = out.records

    # The ramp: one knee, one scale_up, one scale_down — as without restarts.
    assert [r["decision"] for r in actions(recs)] == ["scale_up", "scale_down"], actions(recs)
    assert len(of(recs, "ramp", "knee")) == 1
    up, down = actions(recs)
    assert down["evidence"]["knee"] == up["evidence"]["knee"]
    assert down["evidence"]["util_pct"] == 20.0
    assert len(of(recs, "ramp", "warmup")) == 1
    # The breaker stayed open across the first restart and half-opened from open.
    assert expert5(recs) == ["open", "half_open", "open", "half_open", "closed"]
    befores = [r["evidence"]["before"] for r in of(recs, "moe", "breaker")]
    assert befores == ["closed", "open", "half_open", "open", "half_open"]
    # One initial threshold; the drift lowers it from there.
    rag = of(recs, "rag", "rag_threshold")
    assert [r["decision"] for r in rag][:1] == ["initial"]
    assert all(r["decision"] == "lowered" for r in rag[1:]) and len(rag) >= 2, rag
    assert rag[1]["evidence"]["previous"] == rag[0]["evidence"]["threshold"]
    assert len({r["event_id"] for r in recs}) == len(recs)
    # The knee history came through both restarts (it is a record of its own,
    # written when an interval closes): it starts at the ramp's first interval,
    # not at a restart, in order, with no interval missing.
    assert worker.stop() == 0
    state = read_table(namespace.broker, f"{namespace.app_id}-tailguard-capacity-changelog")
    history = decode_knee(state[b"K\x1fchat|ramp"], KneeConfig()).samples
    ends = [s.ts_ms for s in history]
    assert ends == sorted(set(ends))
    assert ends[0] <= T0 + 2 * cap.INTERVAL_MS, ends[:3]
    assert len(ends) == (ends[-1] - ends[0]) // cap.INTERVAL_MS + 1


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "through-the-topic"])
def test_a_killed_worker_counts_each_request_once_in_its_load_intervals(
    namespace: Any,
    worker_factory: Callable[..., Any],
    produce: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    in_place: bool,
) -> None:
    """The ingest acknowledges its input at checkpoints: a worker killed before one
    applies (in place) or forwards (to the capacity agent) the same requests again
    once restarted. Every closed load interval (the knee history) must hold each
    request once.

    Checkpoints are set far apart, so the restart replays the whole first half
    (every request it applies again is one the deployment's state holds already).
    A single worker owns every partition, so it applies every deployment's
    requests in place unless told to send them through the internal topic.
    """
    from tailguard.streams.capacity import LoadWindow

    monkeypatch.delenv("TAILGUARD_CAPACITY", raising=False)
    monkeypatch.setenv("TAILGUARD_CAPACITY_IN_PLACE", "1" if in_place else "0")
    monkeypatch.setenv("TAILGUARD_CHECKPOINT_S", "600")
    ramp = cap.capacity_scenarios(T0)["ramp"]
    half = len(ramp) // 2
    topic = namespace.topic("tailguard.inference")
    changelog = f"{namespace.app_id}-tailguard-capacity-changelog"

    # What an uninterrupted run closes: every interval of the scenario.
    window = LoadWindow(cap.INTERVAL_MS, 2_000)
    want = [
        (c.sample.ts_ms, c.sample.concurrency, c.sample.p95_ms, c.sample.tokens_per_s)
        for e in ramp
        if not e.get("warmup")
        for c in window.add(e["ts_ms"], e["e2e_ms"], e.get("output_tokens") or 0)
    ]
    first_half_end = ramp[half - 1]["ts_ms"]

    admin = AdminClient({"bootstrap.servers": namespace.broker})

    def history() -> list[tuple[int, float, float, float]]:
        # Asking for a topic by name would create it (broker defaults) before the
        # worker does: list them all instead.
        if changelog not in admin.list_topics(timeout=10).topics:
            return []
        raw = read_table(namespace.broker, changelog).get(b"K\x1fchat|ramp")
        if raw is None:
            return []
        samples = decode_knee(raw, KneeConfig()).samples
        return [(s.ts_ms, s.concurrency, s.p95_ms, s.tokens_per_s) for s in samples]

    def wait_until(done: Callable[[list[tuple[int, float, float, float]]], bool]) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert worker.alive(), worker.log_tail()
            if done(history()):
                return
            time.sleep(1)
        raise AssertionError(f"knee history not there in time: {history()[-3:]}")

    worker = worker_factory("w1").start()
    produce(namespace.broker, topic, messages(ramp[:half], b"ramp"))
    # The first half's intervals are closed, all but the last one or two.
    wait_until(lambda h: bool(h) and h[-1][0] >= first_half_end - 2 * cap.INTERVAL_MS)
    worker.kill()
    worker = worker_factory("w1").start()
    produce(namespace.broker, topic, messages(ramp[half:], b"ramp"))
    wait_until(lambda h: bool(h) and h[-1][0] >= want[-1][0])
    assert worker.stop() == 0
    got = history()
    assert [s[0] for s in got] == [s[0] for s in want]
    assert got == want
    # The path taken: only the one through the topic writes the internal topic.
    forwarded = internal_records(namespace)
    assert forwarded == 0 if in_place else forwarded > 0


def internal_records(namespace: Any) -> int:
    """Records ever written to the namespace's internal capacity topic."""
    name = namespace.topic("tailguard.internal.capacity")
    consumer = Consumer({"bootstrap.servers": namespace.broker, "group.id": "tg-test-watermarks"})
    try:
        partitions = consumer.list_topics(name, timeout=10).topics[name].partitions
        return sum(
            consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1]
            for p in partitions
        )
    finally:
        consumer.close()
