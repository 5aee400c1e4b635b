"""A deployment's capacity state, and what a batch of its requests does to it.

The capacity agent reads each deployment's requests as columns
(:class:`~tailguard.agents.capacity_columns.CapacityRows`) and applies them as
if one by one, in input order, without a Python step per request where the
request changes nothing but counters:

- the load window takes every request but warm-up ones in one numpy pass per
  interval that closes (:meth:`~tailguard.streams.capacity.LoadWindow.add_many`);
  each closed interval updates the knee and gets a scaling decision, judged
  with the GPUs that served the deployment since the previous one;
- the warm-up tracker sees only the requests of instances it watches (those
  with warm-up requests, before or in this batch); the expert breakers only
  requests that name experts; the RAG thresholds only requests with a
  similarity.

These parts do not read each other's state (the GPUs aside, gathered up to
each closing request), so applying them part by part gives the states a
request-by-request pass gives. What they publish comes back as
:class:`Effect` values in that pass's order — by request, then warm-up,
breaker, RAG threshold, closed intervals — for the agent to publish.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from tailguard.agents.capacity_columns import CapacityRows
from tailguard.agents.capacity_tuning import CapacityTuning
from tailguard.streams.breaker import ExpertBreakers, Transition
from tailguard.streams.capacity import (
    Decision,
    IntervalLoad,
    LoadWindow,
    WarmupReport,
    WarmupTracker,
    decide,
)
from tailguard.streams.capacity_state import CoreState
from tailguard.streams.knee import Knee, KneeTracker
from tailguard.streams.rag import RagThreshold

__all__ = ["Breaker", "Deployment", "Effect", "Interval", "RagChange", "Warmup", "apply_rows"]

#: The GPU utilisation, memory fraction and evidence of a deployment, as of now.
GpuState = Callable[["Deployment"], tuple[float | None, float | None, dict[str, Any]]]
RagTracker = Callable[["Deployment", str], RagThreshold]


@dataclass(slots=True)
class Deployment:
    """One deployment's capacity state, as the agent keeps it between messages."""

    service: str
    model: str
    tuning: CapacityTuning
    core: CoreState
    experts: ExpertBreakers
    rag: dict[str, RagThreshold] = field(default_factory=dict)
    #: Written since the last save: the expert breakers, these RAG indexes, the knee.
    experts_dirty: bool = False
    rag_dirty: set[str] = field(default_factory=set)
    knee_dirty: bool = False

    @classmethod
    def new(cls, service: str, model: str, tuning: CapacityTuning) -> "Deployment":
        core = CoreState(
            LoadWindow(tuning.interval_ms, tuning.grace_ms),
            KneeTracker(tuning.knee),
            warmup=WarmupTracker(tuning.warmup_after),
        )
        return cls(service, model, tuning, core, ExpertBreakers(tuning.breaker))


class Warmup(NamedTuple):
    """An instance's warm-up report (once per instance)."""

    ts_ms: int
    instance: str
    report: WarmupReport


class Breaker(NamedTuple):
    """An expert breaker moved (with the evidence to publish)."""

    ts_ms: int
    transition: Transition
    evidence: dict[str, Any]


class RagChange(NamedTuple):
    """A RAG index's similarity threshold moved."""

    ts_ms: int
    rag_index: str
    change: dict[str, Any]


class Interval(NamedTuple):
    """A load interval closed: the knee it moved (if any) and the scaling decision."""

    closed: IntervalLoad
    knee: Knee | None
    decision: Decision
    gpu_evidence: dict[str, Any]


Effect = Warmup | Breaker | RagChange | Interval


def apply_rows(
    dep: Deployment, rows: CapacityRows, gpu_state: GpuState, rag_tracker: RagTracker
) -> list[Effect]:
    """Apply ``rows`` to ``dep``; what to publish, in a request-by-request pass's order."""
    parts: tuple[list[tuple[int, Any]], ...] = (
        _warmups(dep, rows),
        _breakers(dep, rows),
        _rags(dep, rows, rag_tracker),
        _load(dep, rows, gpu_state),
    )
    # (request, part, order within the part, effect)
    found = [(i, rank, seq, e) for rank, p in enumerate(parts) for seq, (i, e) in enumerate(p)]
    found.sort(key=lambda f: f[:3])
    return [effect for *_, effect in found]


def _warmups(dep: Deployment, rows: CapacityRows) -> list[tuple[int, Warmup]]:
    tracker = dep.core.warmup
    if rows.instance is None:
        return []
    watched = set(tracker.before)
    watched.update(rows.instance[i] for i in np.flatnonzero(rows.warm).tolist())
    watched.discard(None)
    watched.discard("")
    if not watched:
        return []  # no request of an instance warming up: the tracker ignores them all
    out = []
    for i, instance in enumerate(rows.instance):
        if instance in watched:
            ttft = float(rows.ttft[i])
            warm = bool(rows.warm[i])
            report = tracker.add(instance, warm, None if math.isnan(ttft) else ttft)
            if report is not None:
                out.append((i, Warmup(int(rows.ts[i]), instance, report)))
    return out


def _breakers(dep: Deployment, rows: CapacityRows) -> list[tuple[int, Breaker]]:
    if rows.expert_ids is None:
        return []
    out = []
    for i, experts in enumerate(rows.expert_ids):
        if not experts:
            continue
        dep.experts_dirty = True
        ts = int(rows.ts[i])
        for t in dep.experts.observe(experts, bool(rows.ok[i]), float(rows.e2e[i]), ts):
            ev = {**t.evidence, "before": t.before, "open_experts": dep.experts.states()}
            ev["fallback_share"] = round(dep.experts.fallback_share(), 4)
            out.append((i, Breaker(ts, t, ev)))
    return out


def _rags(
    dep: Deployment, rows: CapacityRows, tracker_of: RagTracker
) -> list[tuple[int, RagChange]]:
    if rows.similarity is None:
        return []
    out = []
    for i in np.flatnonzero(~np.isnan(rows.similarity)).tolist():
        index = (rows.rag_index[i] if rows.rag_index is not None else None) or "default"
        tracker = tracker_of(dep, index)
        dep.rag_dirty.add(index)
        change = tracker.add(float(rows.similarity[i]))
        if change is not None:
            out.append((i, RagChange(int(rows.ts[i]), index, change)))
    return out


def _load(dep: Deployment, rows: CapacityRows, gpu_state: GpuState) -> list[tuple[int, Interval]]:
    """Every request but warm-up ones into the load window; each closed interval's
    knee and scaling decision (warm-up load is not serving capacity)."""
    core = dep.core
    serving = np.flatnonzero(~rows.warm)
    closes = core.load.add_many(rows.ts[serving], rows.e2e[serving], rows.tokens[serving])
    out = []
    gathered = 0  # requests whose GPUs are in core.gpus
    for k, closed in closes:
        i = int(serving[k])
        _gather_gpus(core.gpus, rows, gathered, i + 1)
        gathered = i + 1  # closing requests come in order
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
        out.append((i, Interval(closed, knee, decision, gpu_ev)))
        core.gpus.clear()
    _gather_gpus(core.gpus, rows, gathered, len(rows))
    return out


def _gather_gpus(gpus: set[tuple[str, int]], rows: CapacityRows, lo: int, hi: int) -> None:
    """The ``(host, GPU)`` pairs that served requests ``[lo, hi)``."""
    if lo < hi and len(rows.gpus):
        gpus.update(rows.gpus.gpus(lo, hi))
