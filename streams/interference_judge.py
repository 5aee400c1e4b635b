"""Tenant interference: judging a deployment's closed minutes.

Which minutes are ready, each tenant's baseline, the victim/neighbour test
and the breach lifecycle (see :mod:`~tailguard.streams.interference` for the
rules in words).
"""

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tailguard.streams.interference_inputs import (
    KvView,
    SeriesHistory,
    TenantMinute,
    frag_between,
    share_between,
    tenant_minutes,
)
from tailguard.streams.interference_model import (
    METRICS,
    Baseline,
    DeploymentState,
    InterferencePolicy,
    InterferenceTransition,
    Severity,
    TransitionState,
    VictimState,
    interference_breach_id,
)
from tailguard.streams.kv import MINUTE_MS

__all__ = [
    "evaluate",
    "ready_minutes",
    "stalled",
]


def ready_minutes(
    state: DeploymentState, policy: InterferencePolicy, *, force: bool = True
) -> list[int]:
    """Minute ends that can be evaluated now, oldest first (see *Readiness*).

    ``force=False`` waits for *every* series of the last ``history_minutes``,
    stalled ones included (see :func:`stalled`).
    """
    if not state.series or state.first_ms is None:
        return []
    newest = max(state.series.values())
    reach = policy.stall_minutes if force else policy.history_minutes
    through = min(end for end in state.series.values() if end >= newest - reach * MINUTE_MS)
    start = state.first_ms if state.evaluated_ms is None else state.evaluated_ms + MINUTE_MS
    start = max(start, through - policy.history_minutes * MINUTE_MS)
    return list(range(start, through + 1, MINUTE_MS))


def stalled(state: DeploymentState, policy: InterferencePolicy) -> bool:
    """True when a series more than ``stall_minutes`` behind holds evaluation back.

    In event time alone a series that stopped looks like one that lags (a
    compressed replay, one input partition read ahead of another); the caller
    decides, e.g. by waiting a little wall-clock time for it to catch up before
    evaluating without it (``force=True``).
    """
    return ready_minutes(state, policy, force=True) != ready_minutes(state, policy, force=False)


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def _correlation(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3:
        return None
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:  # a constant series
        return None


def _fresh_baseline(
    tenants: Mapping[str, Mapping[int, TenantMinute]],
    victim: str,
    from_ms: int,
    to_ms: int,
) -> Baseline:
    """Baseline over the minutes ending in ``[from_ms, to_ms)``."""
    minutes_with_data = sorted(
        {end for per in tenants.values() for end in per if from_ms <= end < to_ms}
    )
    mine = {end: tm for end, tm in tenants.get(victim, {}).items() if from_ms <= end < to_ms}
    p99: dict[str, float] = {}
    for metric in METRICS:
        med = _median([tm.p99[metric] for tm in mine.values() if metric in tm.p99])
        if med is not None and med > 0:
            p99[metric] = med
    rates: dict[str, float] = {}
    for tenant, per in tenants.items():
        med = _median([per[end].rate if end in per else 0.0 for end in minutes_with_data])
        rates[tenant] = med if med is not None else 0.0
    return Baseline(from_ms=from_ms, to_ms=to_ms, points=len(mine), p99=p99, rates=rates, frag={})


@dataclass(slots=True)
class _Judgement:
    """What one minute says about one tenant as a victim."""

    candidate: bool
    jitter: float | None = None
    metric: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    attribution: list[dict[str, Any]] = field(default_factory=list)
    compliance: float | None = None
    variants: set[str] = field(default_factory=set)


def _judge(
    victim: str,
    end_ms: int,
    base: Baseline,
    tenants: Mapping[str, Mapping[int, TenantMinute]],
    kv: KvView,
    policy: InterferencePolicy,
) -> _Judgement:
    now = tenants.get(victim, {}).get(end_ms)
    if now is None:
        return _Judgement(candidate=False)
    ratios = {m: now.p99[m] / base.p99[m] for m in METRICS if m in now.p99 and m in base.p99}
    trig = [m for m in policy.trigger_metrics if m in ratios]
    metric = max(trig, key=lambda m: ratios[m]) if trig else None
    jitter = ratios[metric] if metric is not None else None
    own_base = base.rates.get(victim, 0.0)
    own = now.rate / own_base if own_base > 0 else math.inf
    evidence: dict[str, Any] = {
        "victim": victim,
        "metric": metric,
        "minute_end_ms": end_ms,
        "baseline": {"from_ms": base.from_ms, "to_ms": base.to_ms, "minutes": base.points},
        "victim_requests": now.count,
        "victim_p99_ms": {m: now.p99[m] for m in METRICS if m in now.p99},
        "victim_p99_baseline_ms": dict(base.p99),
        "victim_p99_ratio": ratios,
        "victim_rate_rps": now.rate,
        "victim_rate_baseline_rps": own_base,
        "victim_load_ratio": _finite(own),
        "victim_compliance": now.compliance,
    }
    judged = _Judgement(
        candidate=False,
        jitter=jitter,
        metric=metric,
        evidence=evidence,
        compliance=now.compliance,
        variants=set(now.variants),
    )
    enough = now.count >= policy.min_requests and base.points >= policy.min_baseline_points
    if (
        not enough
        or metric is None
        or jitter is None
        or jitter < policy.jitter_ratio
        or own > policy.own_load_max
    ):
        return judged

    kv_lo = end_ms - policy.kv_minutes * MINUTE_MS
    corr_lo = end_ms - policy.correlation_minutes * MINUTE_MS
    victim_series = tenants.get(victim, {})
    corr_minutes = sorted(
        end for end, tm in victim_series.items() if corr_lo < end <= end_ms and metric in tm.p99
    )
    neighbours: list[dict[str, Any]] = []
    for tenant in sorted(tenants):
        if tenant == victim:
            continue
        theirs = tenants[tenant].get(end_ms)
        if theirs is None or theirs.count < policy.min_requests:
            continue
        rate_base = base.rates.get(tenant, 0.0)
        load = theirs.rate / rate_base if rate_base > 0 else math.inf
        if load < policy.neighbour_load_min:
            continue
        affected: list[dict[str, Any]] = []
        for instance in kv.instances_with((victim, tenant), kv_lo, end_ms):
            minutes = kv.minutes(instance)
            frag_now = frag_between(minutes, kv_lo, end_ms)
            frag_base = base.frag.get(instance)
            if frag_base is None:
                frag_base = frag_between(minutes, base.from_ms - MINUTE_MS, base.to_ms - MINUTE_MS)
                if frag_base is not None:
                    base.frag[instance] = frag_base
            if frag_now is None or frag_base is None or frag_now - frag_base < policy.frag_rise_min:
                continue
            affected.append(
                {
                    "instance": instance,
                    "fragmentation": frag_now,
                    "fragmentation_baseline": frag_base,
                    "neighbour_token_share": share_between(minutes, tenant, kv_lo, end_ms),
                    "neighbour_token_share_baseline": share_between(
                        minutes, tenant, base.from_ms - MINUTE_MS, base.to_ms - MINUTE_MS
                    ),
                    "victim_token_share": share_between(minutes, victim, kv_lo, end_ms),
                }
            )
        if policy.require_kv and not affected:
            continue
        their_series = tenants[tenant]
        xs = [victim_series[end].p99[metric] for end in corr_minutes]
        ys = [their_series[end].rate if end in their_series else 0.0 for end in corr_minutes]
        neighbours.append(
            {
                "tenant": tenant,
                "excess_rps": theirs.rate - rate_base,
                "rate_rps": theirs.rate,
                "rate_baseline_rps": rate_base,
                "load_ratio": _finite(load),
                "correlation": _correlation(xs, ys),
                "instances": affected,
            }
        )
    if not neighbours:
        return judged
    total = sum(max(n["excess_rps"], 0.0) for n in neighbours)
    for n in neighbours:
        n["share"] = max(n["excess_rps"], 0.0) / total if total > 0 else 1.0 / len(neighbours)
    neighbours.sort(key=lambda n: (-n["share"], n["tenant"]))
    frag_rows = {row["instance"]: row for n in neighbours for row in n["instances"]}
    evidence["shared_instances"] = [frag_rows[i] for i in sorted(frag_rows)]
    if frag_rows:
        # Token-weighted over the affected instances together, now and at baseline.
        shared = [m for i in sorted(frag_rows) for m in kv.minutes(i)]
        lo, hi = base.from_ms - MINUTE_MS, base.to_ms - MINUTE_MS
        evidence["fragmentation"] = frag_between(shared, kv_lo, end_ms)
        evidence["fragmentation_baseline"] = frag_between(shared, lo, hi)
    evidence["correlation"] = {n["tenant"]: n["correlation"] for n in neighbours}
    judged.candidate = True
    judged.attribution = [
        {
            "tenant": n["tenant"],
            "cause": "noisy_neighbour",
            "share": n["share"],
            "load_ratio": n["load_ratio"],
            "rate_rps": n["rate_rps"],
            "rate_baseline_rps": n["rate_baseline_rps"],
            "correlation": n["correlation"],
            "instances": [r["instance"] for r in n["instances"]],
        }
        for n in neighbours
    ]
    return judged


def _rank(severity: str | None) -> int:
    return {"ticket": 0, "page": 1}.get(severity or "", -1)


def evaluate(
    state: DeploymentState,
    end_ms: int,
    histories: Iterable[SeriesHistory],
    kv: KvView,
    policy: InterferencePolicy,
) -> list[InterferenceTransition]:
    """Judge minute ``end_ms`` for every tenant of the deployment; advance their lifecycles.

    ``histories``: the deployment's series. Minutes not after ``state.evaluated_ms``
    are ignored (no transitions).
    """
    if state.evaluated_ms is not None and end_ms <= state.evaluated_ms:
        return []
    histories = list(histories)
    window = max(policy.baseline_minutes, policy.correlation_minutes) * MINUTE_MS
    tenants = tenant_minutes(histories, end_ms - window - MINUTE_MS, end_ms)
    exemplars: dict[str, list[str]] = {}
    for h in histories:
        exemplars.setdefault(h.tenant, []).extend(h.exemplars)
    out: list[InterferenceTransition] = []
    names = sorted(set(tenants) | set(state.victims))
    for victim in names:
        vs = state.victims.get(victim) or VictimState()
        active = vs.is_open or vs.streak > 0
        if active and vs.baseline is not None:
            base = vs.baseline
        else:
            base = _fresh_baseline(
                tenants, victim, end_ms - policy.baseline_minutes * MINUTE_MS, end_ms
            )
        judged = _judge(victim, end_ms, base, tenants, kv, policy)
        out.extend(_advance(state, victim, vs, base, judged, end_ms, exemplars, policy))
        if vs.is_open or vs.streak > 0:
            state.victims[victim] = vs
        else:
            state.victims.pop(victim, None)
    state.evaluated_ms = end_ms
    return out


def _advance(
    state: DeploymentState,
    victim: str,
    vs: VictimState,
    base: Baseline,
    judged: _Judgement,
    end_ms: int,
    exemplars: Mapping[str, list[str]],
    policy: InterferencePolicy,
) -> list[InterferenceTransition]:

    def transition(kind: TransitionState, reason: str | None = None) -> InterferenceTransition:
        assert vs.breach_id is not None and vs.opened_ms is not None
        attribution = judged.attribution or [
            {"tenant": n, "cause": "noisy_neighbour", "share": s}
            for n, s in zip(vs.neighbours, vs.shares, strict=True)
        ]
        return InterferenceTransition(
            state=kind,
            breach_id=vs.breach_id,
            seq=vs.seq,
            at_ms=end_ms,
            service=state.service,
            model=state.model,
            victim=victim,
            variant=vs.variant or "*",
            severity="page" if vs.severity == "page" else "ticket",
            slo=vs.slo or "p99-jitter",
            opened_ms=vs.opened_ms,
            resolved_ms=end_ms if kind == "resolved" else None,
            evidence=judged.evidence,
            attribution=tuple(attribution),
            exemplars=tuple(exemplars.get(victim, ())),
            reason=reason,
        )

    severity: Severity = (
        "page"
        if judged.compliance is not None and judged.compliance < policy.page_below_compliance
        else "ticket"
    )
    if judged.candidate:
        if vs.streak == 0 and not vs.is_open:
            vs.anchor_ms = end_ms
            vs.baseline = base
        vs.streak += 1
        vs.quiet = 0
        names = [a["tenant"] for a in judged.attribution]
        shares = [a["share"] for a in judged.attribution]
        jitter = judged.jitter or 0.0
        if not vs.is_open:
            if vs.streak < policy.persist_minutes:
                return []
            vs.breach_id = interference_breach_id(state.service, state.model, victim, end_ms)
            vs.opened_ms = end_ms
            vs.seq = 0
            vs.severity = severity
            metric = judged.metric or "latency"
            vs.slo = f"{metric.removesuffix('_ms')}-p99-jitter"
            vs.variant = next(iter(judged.variants)) if len(judged.variants) == 1 else "*"
            vs.neighbours, vs.shares = names, shares
            vs.last_emit_ms, vs.emitted_jitter = end_ms, jitter
            return [transition("opened")]
        reason: str | None = None
        if _rank(severity) > _rank(vs.severity):
            vs.severity = severity
            reason = "severity"
        elif names != vs.neighbours:
            reason = "neighbours"
        elif (
            vs.last_emit_ms is not None
            and end_ms - vs.last_emit_ms >= policy.update_interval_minutes * MINUTE_MS
            and abs(jitter - vs.emitted_jitter)
            >= policy.material_change * max(vs.emitted_jitter, 1.0)
        ):
            reason = "jitter"
        vs.neighbours, vs.shares = names, shares
        if reason is None:
            return []
        vs.seq += 1
        vs.last_emit_ms, vs.emitted_jitter = end_ms, jitter
        return [transition("updated", reason)]
    if not vs.is_open:
        vs.streak, vs.anchor_ms, vs.baseline = 0, None, None
        return []
    vs.quiet += 1
    if vs.quiet < policy.resolve_minutes:
        return []
    vs.seq += 1
    resolved = transition("resolved")
    vs.streak, vs.anchor_ms, vs.baseline = 0, None, None
    vs.breach_id = None
    vs.opened_ms = None
    vs.quiet = 0
    return [resolved]
