"""Tenant interference: one tenant's P99 jitter explained by another's load and KV fragmentation.

SPEC §3 item 5. Tenants of one deployment (service, model) share its serving
instances; when one tenant's load grows, the others can queue longer and
stream slower, and the KV cache they share fragments (the article: 1 tenant
→ fragmentation 0.08, P99 142 ms; 4 tenants → 0.37, 289 ms). This detector
names the *victim*, the *noisy neighbour(s)* and the evidence.

Inputs, per deployment, in event time:

- the 1-minute SLI point of every series (``tailguard.sli`` with
  ``window_s = 60``), folded per tenant across variants (:class:`TenantMinute`:
  counts add up; a P99 is the count-weighted mean of the variants' P99s,
  exact when the tenant has one variant);
- the KV minutes of the instances (:class:`~tailguard.streams.kv.KvMinute`,
  through a :class:`KvView`), which say which tenants share an instance and
  how fragmented it is.

Every closed minute ``E`` (see *Readiness*), for each tenant ``v`` with at
least ``min_requests`` requests in ``E``::

    baseline   B = [anchor − baseline_minutes, anchor)      anchor = E, or the first minute
                                                            of v's current episode (frozen)
    jitter     J = max over trigger metrics of  P99_v(E) / median_B P99_v
    own load   L = rate_v(E) / median_B rate_v              rate = requests / 60 s; a minute
                                                            without points counts as 0
    neighbour  n ≠ v with ≥ min_requests in E and rate_n(E) / median_B rate_n ≥ neighbour_load_min
               sharing ≥ 1 *affected* instance with v: an instance whose KV minutes in
               (E − kv_minutes, E] hold sequences of both, and whose token-weighted
               fragmentation there exceeds its own over B by ≥ frag_rise_min

    v is a candidate at E  ⇔  J ≥ jitter_ratio  ∧  L ≤ own_load_max  ∧  ≥ 1 neighbour

A victim must not have brought the load itself (``L``), and the neighbour's
load and the instances' fragmentation must both have risen: a fleet-wide
surge (everyone's load up) or a slow model (no neighbour) is not interference.

Lifecycle per (deployment, victim), like the burn-rate breaches::

    minute       · · C C C C C C · C C · · · · · ·
    streak         1 2 3                                    C candidate, · not
    transitions        ▲ opened          ▲ resolved         (persist_minutes = 3,
                       anchor frozen at  quiet for            resolve_minutes = 3)
                       the streak's start resolve_minutes

- **opened** after ``persist_minutes`` consecutive candidate minutes. The
  baselines (victim P99s, every tenant's rate, each shared instance's
  fragmentation) are frozen at the streak's first minute, so a long incident
  never becomes its own baseline.
- **updated** when the set of neighbours changes, the severity rises, or the
  jitter moved by ``material_change`` at least ``update_interval_minutes``
  after the last transition.
- **resolved** after ``resolve_minutes`` consecutive minutes that are not
  candidates.

Severity: ``page`` when the victim's SLO compliance in a candidate minute falls
below ``page_below_compliance``, else ``ticket`` (the jitter itself need not
break an SLO to be worth a ticket).

Attribution ranks the neighbours by their share of the excess load,
``(rate_n(E) − base_n) / Σ (rate_k(E) − base_k)``. Evidence (the breach's
``sli``) holds the victim's P99s now and at baseline, its own load, the
affected instances with their fragmentation now and at baseline (each, and
token-weighted over all of them) and the neighbour's share of their KV
tokens, and the Pearson correlation between the victim's P99 and each
neighbour's rate over the last ``correlation_minutes``.

*Readiness*: series of a deployment report their minutes independently (each
when its own watermark passes). Minute ``E`` is evaluated once every series
has reported ``E`` or later (a series with no request in ``E`` reports a
later minute). A series more than ``stall_minutes`` of event time behind the
others has either stopped or lags (in a compressed replay one partition can
run many minutes ahead of another): the caller says when to stop waiting for
it (:func:`stalled`, ``force``; the agent waits a few seconds of wall-clock
time). A point for an evaluated minute is kept (later baselines use it) and
counted as late.

Everything is a function of the points and KV minutes in their arrival order;
``breach_id`` is derived from the deployment, the victim and the opening
minute, and each transition's ``event_id`` is ``breach_id:seq``, so a replay
yields the same breaches.
"""

import hashlib
import math
import statistics
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec
from tailguard.streams.errors import ConfigError, CorruptStateError
from tailguard.streams.kv import MINUTE_MS, KvMinute, fragmentation

__all__ = [
    "KIND",
    "METRICS",
    "DeploymentState",
    "Detector",
    "Gate",
    "InterferencePolicy",
    "InterferenceTransition",
    "KvBook",
    "KvView",
    "Offered",
    "SeriesHistory",
    "SliPoint",
    "TenantMinute",
    "evaluate",
    "explain",
    "interference_breach_id",
    "judge_ready",
    "offer",
    "ready_minutes",
    "stalled",
    "tenant_minutes",
]

KIND = "interference"
#: Latency metrics read from the SLI points (their P99s).
METRICS: tuple[str, ...] = ("ttft_ms", "itl_ms", "e2e_ms")
Severity = Literal["page", "ticket"]
#: How :func:`offer` may evaluate: not yet, complete minutes only, or without stalled series.
Gate = Literal["hold", "wait", "force"]
TransitionState = Literal["opened", "updated", "resolved"]
_WIRE_VERSION = 1


@dataclass(frozen=True, slots=True)
class InterferencePolicy:
    """Thresholds of the detector (minutes are event-time minutes)."""

    baseline_minutes: int = 30
    #: Minutes with points the victim needs in its baseline before it is judged.
    min_baseline_points: int = 10
    #: Requests per minute a victim (and a neighbour) needs in the judged minute.
    min_requests: int = 30
    #: P99 over its baseline median that counts as jitter (any trigger metric).
    jitter_ratio: float = 1.5
    trigger_metrics: tuple[str, ...] = ("ttft_ms", "itl_ms")
    #: The victim's own load over its baseline must stay at or below this.
    own_load_max: float = 1.25
    #: A neighbour's load over its baseline must reach this.
    neighbour_load_min: float = 1.5
    #: Minimum rise of an instance's fragmentation over its baseline (absolute).
    frag_rise_min: float = 0.05
    #: KV minutes read as "now": (E − kv_minutes, E].
    kv_minutes: int = 3
    #: Without KV evidence (no affected shared instance) nobody is a neighbour.
    require_kv: bool = True
    persist_minutes: int = 3
    resolve_minutes: int = 3
    update_interval_minutes: int = 5
    material_change: float = 0.25
    page_below_compliance: float = 0.99
    correlation_minutes: int = 30
    stall_minutes: int = 10
    #: Minutes of points kept per series (≥ the longest window read).
    history_minutes: int = 45

    def __post_init__(self) -> None:
        for name in (
            "baseline_minutes",
            "min_baseline_points",
            "kv_minutes",
            "persist_minutes",
            "resolve_minutes",
            "correlation_minutes",
            "stall_minutes",
            "history_minutes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"{name} must be an integer ≥ 1, got {value!r}"
                raise ConfigError(msg)
        if self.update_interval_minutes < 0 or self.min_requests < 0:
            msg = "update_interval_minutes and min_requests must be ≥ 0"
            raise ConfigError(msg)
        if self.min_baseline_points > self.baseline_minutes:
            msg = (
                f"min_baseline_points ({self.min_baseline_points}) cannot exceed "
                f"baseline_minutes ({self.baseline_minutes})"
            )
            raise ConfigError(msg)
        longest = max(self.baseline_minutes, self.correlation_minutes) + self.stall_minutes
        if self.history_minutes < longest:
            msg = (
                f"history_minutes ({self.history_minutes}) must cover the baseline or "
                f"correlation window plus stall_minutes ({longest})"
            )
            raise ConfigError(msg)
        if not self.jitter_ratio > 1 or not self.neighbour_load_min > 1:
            msg = "jitter_ratio and neighbour_load_min must be > 1 (ratios over a baseline)"
            raise ConfigError(msg)
        if not self.own_load_max > 0 or not self.material_change > 0:
            msg = "own_load_max and material_change must be > 0"
            raise ConfigError(msg)
        if not 0 <= self.frag_rise_min < 1 or not 0 < self.page_below_compliance <= 1:
            msg = "frag_rise_min must be in [0, 1) and page_below_compliance in (0, 1]"
            raise ConfigError(msg)
        unknown = [m for m in self.trigger_metrics if m not in METRICS]
        if unknown or not self.trigger_metrics:
            msg = f"trigger_metrics must be a non-empty subset of {METRICS}, got {unknown}"
            raise ConfigError(msg)


# ------------------------------------------------------------------- inputs


class SliPoint(msgspec.Struct, array_like=True, gc=False):
    """One series' 1-minute SLI snapshot, reduced to what the detector reads."""

    end_ms: int
    count: int
    errors: int = 0
    ttft_p99: float | None = None
    ttft_n: int = 0
    itl_p99: float | None = None
    itl_n: int = 0
    e2e_p99: float | None = None
    e2e_n: int = 0
    compliance: float | None = None

    def p99(self, metric: str) -> tuple[float | None, int]:
        if metric == "ttft_ms":
            return self.ttft_p99, self.ttft_n
        if metric == "itl_ms":
            return self.itl_p99, self.itl_n
        return self.e2e_p99, self.e2e_n


class SeriesHistory(msgspec.Struct):
    """The recent 1-minute points of one series (variant, tenant) of a deployment."""

    variant: str
    tenant: str
    points: list[SliPoint] = []
    #: Trace ids of the slowest requests of the newest point.
    exemplars: list[str] = []

    def add(self, point: SliPoint, exemplars: Sequence[str], history_minutes: int) -> bool:
        """Keep ``point`` (False when that minute is already held: a replay)."""
        ends = [p.end_ms for p in self.points]
        if point.end_ms in ends:
            return False
        if not ends or point.end_ms > ends[-1]:
            self.points.append(point)
            self.exemplars = list(exemplars)
        else:
            self.points.append(point)
            self.points.sort(key=lambda p: p.end_ms)
        horizon = self.points[-1].end_ms - history_minutes * MINUTE_MS
        if self.points[0].end_ms <= horizon:
            self.points = [p for p in self.points if p.end_ms > horizon]
        return True

    def to_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def from_bytes(cls, data: bytes) -> "SeriesHistory":
        try:
            return msgspec.msgpack.decode(data, type=cls)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            msg = f"series history does not decode ({exc}); restore the worker from the changelog"
            raise CorruptStateError(msg) from exc


@dataclass(slots=True)
class TenantMinute:
    """One tenant's minute, folded across its variants."""

    count: int = 0
    errors: int = 0
    p99: dict[str, float] = field(default_factory=dict)
    n: dict[str, int] = field(default_factory=dict)
    compliance: float | None = None
    variants: set[str] = field(default_factory=set)
    _weighted: dict[str, float] = field(default_factory=dict)
    _compliance_sum: float = 0.0
    _compliance_n: int = 0

    @property
    def rate(self) -> float:
        return self.count / 60.0

    def add(self, variant: str, p: SliPoint) -> None:
        self.count += p.count
        self.errors += p.errors
        self.variants.add(variant)
        for metric in METRICS:
            value, n = p.p99(metric)
            if value is None or n <= 0:
                continue
            self._weighted[metric] = self._weighted.get(metric, 0.0) + value * n
            self.n[metric] = self.n.get(metric, 0) + n
            self.p99[metric] = self._weighted[metric] / self.n[metric]
        if p.compliance is not None and p.count > 0:
            self._compliance_sum += p.compliance * p.count
            self._compliance_n += p.count
            self.compliance = self._compliance_sum / self._compliance_n


def tenant_minutes(
    histories: Iterable[SeriesHistory], lo_ms: int, hi_ms: int
) -> dict[str, dict[int, TenantMinute]]:
    """Tenant → minute end → :class:`TenantMinute`, for minutes ending in ``[lo_ms, hi_ms]``."""
    out: dict[str, dict[int, TenantMinute]] = {}
    for h in histories:
        for p in h.points:
            if lo_ms <= p.end_ms <= hi_ms:
                minute = out.setdefault(h.tenant, {}).setdefault(p.end_ms, TenantMinute())
                minute.add(h.variant, p)
    return out


class KvView(Protocol):
    """The KV minutes of the instances, as the detector reads them."""

    def instances_with(self, tenants: Collection[str], since_ms: int, until_ms: int) -> list[str]:
        """Instances with a minute ending in ``(since_ms, until_ms]`` that held
        sequences of every one of ``tenants``, sorted."""
        ...

    def minutes(self, instance: str) -> Sequence[KvMinute]:
        """The instance's minutes, oldest first."""
        ...


class KvBook:
    """KV minutes per instance in memory, indexed by tenant (a :class:`KvView`).

    ``add`` keeps at most ``history_minutes`` of event time per instance and
    ignores a minute it already holds (replays).
    """

    def __init__(self, history_minutes: int = 90) -> None:
        self.history_minutes = history_minutes
        self._minutes: dict[str, list[KvMinute]] = {}
        self._tenants: dict[str, set[str]] = {}

    def add(self, instance: str, minute: KvMinute) -> bool:
        held = self._minutes.setdefault(instance, [])
        if any(m.end_ms == minute.end_ms for m in held):
            return False
        held.append(minute)
        if len(held) > 1 and held[-2].end_ms > minute.end_ms:
            held.sort(key=lambda m: m.end_ms)
        horizon = held[-1].end_ms - self.history_minutes * MINUTE_MS
        if held[0].end_ms <= horizon:
            self._minutes[instance] = [m for m in held if m.end_ms > horizon]
        for tenant in minute.tenants:
            self._tenants.setdefault(tenant, set()).add(instance)
        return True

    def load(self, instance: str, minutes: Iterable[KvMinute]) -> None:
        """Restore an instance's stored minutes."""
        for minute in minutes:
            self.add(instance, minute)

    def minutes(self, instance: str) -> Sequence[KvMinute]:
        return self._minutes.get(instance, [])

    def instances(self) -> list[str]:
        return sorted(self._minutes)

    def instances_with(self, tenants: Collection[str], since_ms: int, until_ms: int) -> list[str]:
        wanted = list(tenants)
        if not wanted:
            return []
        candidates = set.intersection(*(self._tenants.get(t, set()) for t in wanted))
        out = []
        for instance in sorted(candidates):
            for m in self._minutes.get(instance, []):
                if since_ms < m.end_ms <= until_ms and all(
                    t in m.tenants and m.tenants[t].sequences > 0 for t in wanted
                ):
                    out.append(instance)
                    break
        return out

    @staticmethod
    def encode(minutes: Sequence[KvMinute]) -> bytes:
        return msgspec.msgpack.encode(list(minutes))

    @staticmethod
    def decode(data: bytes) -> list[KvMinute]:
        try:
            return msgspec.msgpack.decode(data, type=list[KvMinute])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            msg = f"KV history does not decode ({exc}); restore the worker from the changelog"
            raise CorruptStateError(msg) from exc


def _frag_between(minutes: Sequence[KvMinute], lo_ms: int, hi_ms: int) -> float | None:
    """Token-weighted fragmentation over the minutes ending in ``(lo_ms, hi_ms]``."""
    tokens = block_tokens = 0
    for m in minutes:
        if lo_ms < m.end_ms <= hi_ms:
            tokens += m.tokens
            block_tokens += m.block_tokens
    frag: float | None = fragmentation(tokens, block_tokens)
    return frag


def _share_between(
    minutes: Sequence[KvMinute], tenant: str, lo_ms: int, hi_ms: int
) -> float | None:
    """The tenant's share of the tokens held over the minutes ending in ``(lo_ms, hi_ms]``."""
    mine = total = 0
    for m in minutes:
        if lo_ms < m.end_ms <= hi_ms:
            total += m.tokens
            use = m.tenants.get(tenant)
            mine += use.tokens if use is not None else 0
    return None if total == 0 else mine / total


# -------------------------------------------------------------------- state


class Baseline(msgspec.Struct, array_like=True):
    """A victim's baseline over ``[from_ms, to_ms)``; frozen while its episode lasts."""

    from_ms: int
    to_ms: int
    points: int
    p99: dict[str, float]
    #: Every tenant's median request rate (requests/s) over the baseline.
    rates: dict[str, float]
    #: Instance → token-weighted fragmentation over the baseline (filled as instances are met).
    frag: dict[str, float] = {}


class VictimState(msgspec.Struct):
    """Episode and breach of one (deployment, victim)."""

    streak: int = 0
    anchor_ms: int | None = None
    baseline: Baseline | None = None
    breach_id: str | None = None
    opened_ms: int | None = None
    seq: int = 0
    severity: str | None = None
    slo: str | None = None
    variant: str | None = None
    quiet: int = 0
    neighbours: list[str] = []
    shares: list[float] = []
    last_emit_ms: int | None = None
    emitted_jitter: float = 0.0

    @property
    def is_open(self) -> bool:
        return self.breach_id is not None


class DeploymentState(msgspec.Struct):
    """Detector state of one deployment: its series' progress and its victims."""

    service: str
    model: str
    #: ``variant|tenant`` → end of the newest minute that series reported.
    series: dict[str, int] = {}
    evaluated_ms: int | None = None
    first_ms: int | None = None
    victims: dict[str, VictimState] = {}

    @property
    def key(self) -> str:
        return f"{self.service}|{self.model}"

    def note(self, variant: str, tenant: str, end_ms: int) -> bool:
        """Record that a series reported ``end_ms``; False when that minute was evaluated."""
        skey = f"{variant}|{tenant}"
        if end_ms > self.series.get(skey, -1):
            self.series[skey] = end_ms
        if self.first_ms is None or end_ms < self.first_ms:
            self.first_ms = end_ms
        return self.evaluated_ms is None or end_ms > self.evaluated_ms

    def to_bytes(self) -> bytes:
        return msgspec.msgpack.encode((_WIRE_VERSION, self))

    @classmethod
    def from_bytes(cls, data: bytes) -> "DeploymentState":
        try:
            version, state = msgspec.msgpack.decode(data, type=tuple[int, DeploymentState])
            if version != _WIRE_VERSION:
                msg = f"state version {version}, this code reads {_WIRE_VERSION}"
                raise ValueError(msg)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            msg = (
                f"interference state does not decode ({exc}); delete the worker data dir "
                "and let it restore from the changelog"
            )
            raise CorruptStateError(msg) from exc
        return state


def interference_breach_id(service: str, model: str, victim: str, opened_ms: int) -> str:
    """Stable id of the interference breach of ``victim`` that opened at ``opened_ms``."""
    text = f"{service}|{model}\x1f{victim}\x1f{KIND}\x1f{opened_ms}".encode()
    return hashlib.blake2b(text, digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class InterferenceTransition:
    """One lifecycle event of an interference breach (a ``tailguard.breach.v1`` body)."""

    state: TransitionState
    breach_id: str
    seq: int
    at_ms: int
    service: str
    model: str
    victim: str
    #: The victim's variant, or ``"*"`` when its traffic spans several.
    variant: str
    severity: Severity
    slo: str
    opened_ms: int
    resolved_ms: int | None
    evidence: Mapping[str, Any]
    attribution: tuple[Mapping[str, Any], ...]
    exemplars: tuple[str, ...] = ()
    reason: str | None = None

    @property
    def event_id(self) -> str:
        return f"{self.breach_id}:{self.seq}"

    @property
    def series(self) -> tuple[str, str, str, str]:
        return self.service, self.model, self.variant, self.victim


# --------------------------------------------------------------- evaluation


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
            frag_now = _frag_between(minutes, kv_lo, end_ms)
            frag_base = base.frag.get(instance)
            if frag_base is None:
                frag_base = _frag_between(minutes, base.from_ms - MINUTE_MS, base.to_ms - MINUTE_MS)
                if frag_base is not None:
                    base.frag[instance] = frag_base
            if frag_now is None or frag_base is None or frag_now - frag_base < policy.frag_rise_min:
                continue
            affected.append(
                {
                    "instance": instance,
                    "fragmentation": frag_now,
                    "fragmentation_baseline": frag_base,
                    "neighbour_token_share": _share_between(minutes, tenant, kv_lo, end_ms),
                    "neighbour_token_share_baseline": _share_between(
                        minutes, tenant, base.from_ms - MINUTE_MS, base.to_ms - MINUTE_MS
                    ),
                    "victim_token_share": _share_between(minutes, victim, kv_lo, end_ms),
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
        evidence["fragmentation"] = _frag_between(shared, kv_lo, end_ms)
        evidence["fragmentation_baseline"] = _frag_between(shared, lo, hi)
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


# ------------------------------------------------------------------- offer


@dataclass(slots=True)
class Offered:
    """What :func:`offer` did with one point."""

    #: False for a point of a minute the series already reported (a replay).
    accepted: bool
    #: True for a point of a minute that was already evaluated (kept for baselines).
    late: bool
    transitions: list[InterferenceTransition] = field(default_factory=list)
    #: Minutes evaluated.
    evaluated: list[int] = field(default_factory=list)


def offer(
    state: DeploymentState,
    history: SeriesHistory,
    point: SliPoint,
    exemplars: Sequence[str],
    histories: Callable[[], Iterable[SeriesHistory]],
    kv: KvView,
    policy: InterferencePolicy,
    gate: Callable[[DeploymentState], Gate] | None = None,
) -> Offered:
    """Fold one series' point in (``history``: that series' history, updated in place)
    and evaluate every minute that became ready.

    ``histories()`` returns all the deployment's series histories (``history``
    included, as updated); it is called only when a minute is evaluated, so a
    store can load them lazily. ``gate(state)`` says how to evaluate: ``"hold"``
    nothing yet, ``"wait"`` only minutes every series reported, ``"force"``
    without series that stalled (:func:`stalled`; the default).
    """
    if not history.add(point, exemplars, policy.history_minutes):
        return Offered(accepted=False, late=False)
    if not state.note(history.variant, history.tenant, point.end_ms):
        return Offered(accepted=True, late=True)
    return judge_ready(state, histories, kv, policy, gate)


def judge_ready(
    state: DeploymentState,
    histories: Callable[[], Iterable[SeriesHistory]],
    kv: KvView,
    policy: InterferencePolicy,
    gate: Callable[[DeploymentState], Gate] | None = None,
) -> Offered:
    """Evaluate every minute of the deployment that is ready (see :func:`offer`)."""
    out = Offered(accepted=True, late=False)
    mode = "force" if gate is None else gate(state)
    if mode == "hold":
        return out
    ready = ready_minutes(state, policy, force=mode == "force")
    if ready:
        every = list(histories())
        for end in ready:
            out.transitions.extend(evaluate(state, end, every, kv, policy))
            out.evaluated.append(end)
    return out


def _hhmm(ms: int) -> str:
    minutes = ms // MINUTE_MS
    return f"{minutes // 60 % 24:02d}:{minutes % 60:02d}Z"


def explain(t: InterferenceTransition) -> str:
    """One line for people: who suffers, from whom, and the evidence."""
    ev = t.evidence
    who = f"{t.service}/{t.model} tenant {t.victim}"
    if t.state == "resolved":
        minutes = (t.at_ms - t.opened_ms) // MINUTE_MS
        return (
            f"{who}: interference resolved, {minutes} min after it opened at {_hhmm(t.opened_ms)}"
        )
    metric = ev.get("metric") or "latency"
    now = ev.get("victim_p99_ms", {}).get(metric)
    base = ev.get("victim_p99_baseline_ms", {}).get(metric)
    ratio = ev.get("victim_p99_ratio", {}).get(metric)
    parts = [f"{who}: {metric.removesuffix('_ms').upper()} P99"]
    if now is not None and base is not None and ratio is not None:
        parts.append(f"{now:.0f} ms = {ratio:.1f}x its baseline {base:.0f} ms")
    load = ev.get("victim_load_ratio")
    parts.append(f"(own load {load:.2f}x)" if load is not None else "")
    blame = []
    for a in t.attribution:
        ratio_n = a.get("load_ratio")
        corr = a.get("correlation")
        bit = f"{a['tenant']} ({a.get('share', 0):.0%} of the excess load"
        bit += f", load {ratio_n:.1f}x" if ratio_n is not None else ", new load"
        bit += f", correlation {corr:.2f}" if corr is not None else ""
        blame.append(bit + ")")
    parts.append("because of " + ", ".join(blame) if blame else "")
    shared = ev.get("shared_instances") or []
    if shared:
        f_now = ev.get("fragmentation")
        f_base = ev.get("fragmentation_baseline")
        parts.append(
            f"on {len(shared)} shared instance(s), KV fragmentation {f_base:.2f} -> {f_now:.2f}"
        )
    return " ".join(p for p in parts if p)


# ------------------------------------------------------------- convenience


class Detector:
    """The detector with its state in memory (tests, notebooks; the agent keeps it in tables).

    ``offer_point`` folds a series' 1-minute point in and evaluates every
    minute that became ready; ``offer_kv`` adds an instance's KV minute.
    """

    def __init__(self, policy: InterferencePolicy | None = None) -> None:
        self.policy = policy or InterferencePolicy()
        self.kv = KvBook()
        self.states: dict[str, DeploymentState] = {}
        self.histories: dict[str, dict[str, SeriesHistory]] = {}
        self.late = 0

    def offer_kv(self, instance: str, minute: KvMinute) -> bool:
        return self.kv.add(instance, minute)

    def offer_point(
        self,
        series: tuple[str, str, str, str],
        point: SliPoint,
        exemplars: Sequence[str] = (),
    ) -> list[InterferenceTransition]:
        service, model, variant, tenant = series
        dkey = f"{service}|{model}"
        state = self.states.setdefault(dkey, DeploymentState(service=service, model=model))
        per = self.histories.setdefault(dkey, {})
        history = per.setdefault(f"{variant}|{tenant}", SeriesHistory(variant, tenant))
        done = offer(state, history, point, exemplars, per.values, self.kv, self.policy)
        self.late += done.late
        return done.transitions
