"""The capacity agent applies a deployment's requests as columns exactly as it would
one request at a time: the same records in the same order, the same state after."""

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.agents.capacity_apply import (
    Breaker,
    Deployment,
    Effect,
    Interval,
    RagChange,
    Warmup,
    apply_rows,
)
from tailguard.agents.capacity_columns import CapacityRows
from tailguard.agents.capacity_rows import Row
from tailguard.agents.capacity_tuning import CapacityTuning
from tailguard.streams.breaker import BreakerPolicy
from tailguard.streams.capacity import decide
from tailguard.streams.knee import KneeConfig
from tailguard.streams.rag import RagConfig, RagThreshold

TUNING = CapacityTuning(
    knee=KneeConfig(min_samples=4),
    breaker=BreakerPolicy(min_requests=3, window=6),
    rag=RagConfig(window=8, min_samples=3),
    warmup_after=3,
)


def gpu_state(dep: Deployment) -> tuple[float | None, float | None, dict[str, Any]]:
    """A fake GPU join whose answer depends on the GPUs gathered (so their timing counts)."""
    gpus = sorted(dep.core.gpus)
    util = 10.0 * len(gpus) if gpus else None
    return util, 0.5, {"gpus": [f"{h}:{g}" for h, g in gpus]}


def rag_tracker(dep: Deployment, index: str) -> RagThreshold:
    return dep.rag.setdefault(index, RagThreshold(TUNING.rag))


def one_by_one(dep: Deployment, rows: list[Row]) -> list[Effect]:
    """The request-by-request pass the columns must reproduce."""
    out: list[Effect] = []
    core = dep.core
    for ts, e2e, ttft, tokens, ok, warm, instance, host, gpus, experts, sim, index in rows:
        if instance:
            report = core.warmup.add(instance, warm, ttft)
            if report is not None:
                out.append(Warmup(ts, instance, report))
        if host:
            core.gpus.update((host, g) for g in gpus)
        if experts:
            dep.experts_dirty = True
            for t in dep.experts.observe(experts, ok, e2e, ts):
                ev = {**t.evidence, "before": t.before, "open_experts": dep.experts.states()}
                ev["fallback_share"] = round(dep.experts.fallback_share(), 4)
                out.append(Breaker(ts, t, ev))
        if sim is not None:
            dep.rag_dirty.add(index)
            change = rag_tracker(dep, index).add(sim)
            if change is not None:
                out.append(RagChange(ts, index, change))
        if warm:
            continue
        for closed in core.load.add(ts, e2e, tokens):
            knee = core.knee.add(closed.sample)
            dep.knee_dirty = True
            util, mem, gpu_ev = gpu_state(dep)
            gpu_ev.update(
                interval_start_ms=closed.start_ms,
                requests=closed.requests,
                p95_ms=round(closed.sample.p95_ms, 3),
                tokens_per_s=round(closed.sample.tokens_per_s, 3),
            )
            decision = decide(
                dep.tuning.scale,
                core.scale,
                ts_ms=closed.end_ms,
                concurrency=closed.sample.concurrency,
                knee=core.knee.published,
                util_pct=util,
                mem_fraction=mem,
            )
            out.append(Interval(closed, knee, decision, gpu_ev))
            core.gpus.clear()
    return out


@st.composite
def requests(draw: Any) -> list[Row]:
    n = draw(st.integers(0, 80))
    ts = draw(st.integers(0, 50_000))
    out: list[Row] = []
    for _ in range(n):
        ts += draw(st.integers(-3_000, 4_000))  # out of order at times; late at times
        warm = draw(st.booleans()) and draw(st.booleans())
        out.append(
            (
                ts,
                draw(st.floats(1.0, 30_000.0)),
                draw(st.one_of(st.none(), st.floats(1.0, 2_000.0))),
                draw(st.integers(0, 50)),
                draw(st.booleans()),
                warm,
                draw(st.sampled_from(["", "vllm-0", "vllm-1"])),
                draw(st.sampled_from(["", "h1", "h2"])),
                draw(st.sampled_from([[], [0], [1, 3]])),
                draw(st.sampled_from([[], [], [2], [2, 5]])),
                draw(st.one_of(st.none(), st.floats(0.0, 1.0))),
                draw(st.sampled_from(["default", "kb"])),
            )
        )
    return out


@settings(max_examples=150, deadline=None)
@given(
    batches=st.lists(requests(), min_size=1, max_size=3),
    knee=st.sampled_from([None, 0.2, 1.0, 3.0]),
)
def test_columns_apply_as_requests_one_by_one(batches: list[list[Row]], knee: float | None) -> None:
    by_column = Deployment.new("chat", "llama", TUNING)
    # A knee known from before, so that decisions turn on the load and the GPUs.
    by_column.core.knee.published = knee
    by_request = copy.deepcopy(by_column)
    for rows in batches:
        got = apply_rows(by_column, CapacityRows.from_rows(rows), gpu_state, rag_tracker)
        assert got == one_by_one(by_request, rows)
    a, b = by_column.core, by_request.core
    assert (a.load.open, a.load.late, a.load.closed_through) == (
        b.load.open,
        b.load.late,
        b.load.closed_through,
    )
    assert (a.knee, a.scale, a.warmup, a.gpus) == (b.knee, b.scale, b.warmup, b.gpus)
    assert by_column.experts.states() == by_request.experts.states()
    assert {k: list(v.values) for k, v in by_column.rag.items()} == {
        k: list(v.values) for k, v in by_request.rag.items()
    }
    dirty = (by_column.experts_dirty, by_column.rag_dirty, by_column.knee_dirty)
    assert dirty == (by_request.experts_dirty, by_request.rag_dirty, by_request.knee_dirty)


def test_a_steady_batch_closes_intervals_and_gathers_the_gpus_before_each() -> None:
    # A request a second, on h1 GPU 0 then (from 20 s) on h2 GPU 1. An interval
    # closes at the first request 2 s (the grace) past its end, and its decision
    # sees the GPUs of the requests since the previous close, that one included.
    rows: list[Row] = []
    for i in range(30):
        host, gpu = ("h1", 0) if i < 20 else ("h2", 1)
        rows.append((i * 1_000, 500.0, 50.0, 5, True, False, "", host, [gpu], [], None, "kb"))
    dep = Deployment.new("chat", "llama", TUNING)
    effects = apply_rows(dep, CapacityRows.from_rows(rows), gpu_state, rag_tracker)
    intervals = [e for e in effects if isinstance(e, Interval)]
    assert [e.closed.start_ms for e in intervals] == [0, 10_000]
    assert [e.gpu_evidence["gpus"] for e in intervals] == [["h1:0"], ["h1:0", "h2:1"]]
    assert dep.core.gpus == {("h2", 1)}  # gathered since the last close (at 22 s)
