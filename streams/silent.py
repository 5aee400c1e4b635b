"""Silent SLO collapse: attainment falls and P95 rises while errors and traffic look normal.

The article's "trap 2": a prefix-cache miss storm, a
batcher waiting out its timeout and token flow control push TTFT P95 from
~320 ms to ~1.8 s; SLO attainment drops from 99.98 % to ~41 %; QPS is
unchanged and no request fails. A burn-rate alert on an *error* SLO never
fires, and a latency burn-rate alert fires late and without saying why.
This detector compares, per series, the short window (5 m) ending at each
closed minute with the series' own learned baseline::

    closed minute ──▶ short window (5 m): attainment A, TTFT P95 P, error rate E, rate R
                      baseline (EWMA of healthy minutes): A₀, P₀, E₀, R₀
    silent  ⇔  A ≤ A₀ − attainment_drop                 SLO attainment collapsed
             ∧ P ≥ p95_rise · P₀                         tail latency rose
             ∧ E ≤ E₀ + error_band                       ... but errors look normal
             ∧ |R / R₀ − 1| ≤ rate_band                  ... and traffic looks normal
             ∧ enough traffic, baseline learned

When errors rose too, nothing here fires: that is an ordinary breach, which
the burn-rate rules of the error SLO report (``kind: burn_rate``).

- *Attainment* is the share of requests that met every latency SLO of the
  series (``good_requests / requests``; a failed request did not attain).
- *Baseline*: exponentially weighted means over closed minutes (``alpha``;
  a running mean over the first ``min_baseline_minutes``) of the minute's
  attainment, TTFT P95, error rate, request rate, the rate of each cause
  flag and each stage's P99. A minute is learned only while no silent
  breach is open and the minute is not itself anomalous, so an incident
  does not become the new normal.
- *Lifecycle*: ``opened`` at the first firing evaluation; ``updated`` when
  attainment fell by another ``material_drop`` since the last transition
  (at most every ``update_interval_ms``); ``resolved`` at the first
  evaluation ``resolve_hold_ms`` after the last firing one. ``breach_id`` is
  derived from the series and the opening minute, so a replay names it the
  same.

All event time: the same minutes give the same transitions. The state is a
small msgpack value stored with the breach states.
"""

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from tailguard.streams.attribution import FACTORS
from tailguard.streams.errors import ConfigError, CorruptStateError

__all__ = [
    "KIND",
    "Baseline",
    "SilentPolicy",
    "SilentState",
    "SilentTransition",
    "WindowStats",
    "advance_silent",
    "factor_rates",
    "replace_state",
    "silent_breach_id",
    "stats_of",
]

KIND = "silent_degradation"
MINUTE_MS = 60_000


@dataclass(frozen=True, slots=True)
class SilentPolicy:
    """Thresholds of the silent-collapse detector (all configurable)."""

    short_window_ms: int = 5 * MINUTE_MS
    #: Requests the short window needs before it is judged.
    min_requests: int = 50
    #: Requests a minute needs to be learned into the baseline.
    min_minute_requests: int = 10
    #: Healthy minutes learned before the detector judges at all.
    min_baseline_minutes: int = 10
    #: Attainment must fall by at least this much (absolute share).
    attainment_drop: float = 0.05
    #: TTFT P95 must reach at least this multiple of the baseline.
    p95_rise: float = 1.5
    #: Error rate may exceed the baseline by at most this much (absolute share).
    error_band: float = 0.01
    #: Request rate may differ from the baseline by at most this share.
    rate_band: float = 0.5
    #: Weight of a new minute in the baseline once learned.
    alpha: float = 1.0 / 30.0
    resolve_hold_ms: int = 3 * MINUTE_MS
    update_interval_ms: int = 5 * MINUTE_MS
    #: A further attainment fall that is worth an ``updated`` transition.
    material_drop: float = 0.1
    #: Attainment drop from which the breach pages instead of opening a ticket.
    page_drop: float = 0.2

    def __post_init__(self) -> None:
        for name in ("short_window_ms", "resolve_hold_ms", "update_interval_ms"):
            value = getattr(self, name)
            if value <= 0 or value % MINUTE_MS:
                msg = f"silent policy: {name} must be a positive whole number of minutes (ms)"
                raise ConfigError(msg)
        for name in ("attainment_drop", "error_band", "material_drop", "page_drop"):
            if not 0.0 < getattr(self, name) < 1.0:
                msg = f"silent policy: {name} must be in (0, 1), got {getattr(self, name)!r}"
                raise ConfigError(msg)
        if not self.p95_rise > 1.0:
            msg = f"silent policy: p95_rise must be > 1, got {self.p95_rise!r}"
            raise ConfigError(msg)
        if not 0.0 < self.rate_band < 1.0 or not 0.0 < self.alpha <= 1.0:
            msg = "silent policy: rate_band must be in (0, 1) and alpha in (0, 1]"
            raise ConfigError(msg)
        if self.min_requests < 1 or self.min_minute_requests < 1 or self.min_baseline_minutes < 1:
            msg = "silent policy: minimum counts must be >= 1"
            raise ConfigError(msg)


class WindowStats(msgspec.Struct, frozen=True):
    """What the detector reads of one window (see :func:`window_stats` in the agent).
    A struct, not a frozen dataclass: a close makes two a series, and a frozen
    dataclass sets each field through ``object.__setattr__`` (ten times slower)."""

    window_ms: int
    requests: int
    errors: int
    good: int
    p95_ttft_ms: float | None
    #: Share of ok requests with each cause flag (order of FACTORS).
    factor_rates: tuple[float, ...]
    stage_p99_ms: Mapping[str, float]

    @property
    def attainment(self) -> float:
        return self.good / self.requests if self.requests else 1.0

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def rate_rps(self) -> float:
        return self.requests / (self.window_ms / 1000.0)

    def over(self, window_ms: int) -> "WindowStats":
        """The same counts read as a window of ``window_ms`` (a young series' short
        window holds the same buckets as its minute)."""
        return WindowStats(
            window_ms,
            self.requests,
            self.errors,
            self.good,
            self.p95_ttft_ms,
            self.factor_rates,
            self.stage_p99_ms,
        )


class Baseline(msgspec.Struct, array_like=True):
    """Learned normal of one series (EWMA over healthy minutes)."""

    minutes: int = 0
    attainment: float = 1.0
    error_rate: float = 0.0
    rate_rps: float = 0.0
    p95_ttft_ms: float | None = None
    factor_rates: list[float] = msgspec.field(default_factory=lambda: [0.0] * len(FACTORS))
    stage_p99_ms: dict[str, float] = msgspec.field(default_factory=dict)


class SilentState(msgspec.Struct, array_like=True):
    """Detector state of one series: its baseline and the open breach, if any."""

    series_key: str
    last_at_ms: int | None = None
    baseline: Baseline = msgspec.field(default_factory=Baseline)
    breach_id: str | None = None
    seq: int = 0
    opened_ms: int | None = None
    last_fired_ms: int | None = None
    last_transition_ms: int | None = None
    attainment_at_transition: float | None = None
    severity: str | None = None

    @property
    def is_open(self) -> bool:
        return self.breach_id is not None

    def to_bytes(self) -> bytes:
        return _ENCODER.encode(self)

    @classmethod
    def from_bytes(cls, data: bytes, *, key: Any = None) -> "SilentState":
        try:
            return _DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            msg = f"silent-detector state {key!r} does not decode ({exc})"
            raise CorruptStateError(msg) from exc


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(SilentState)


#: What a lifecycle event of a silent breach says.
TransitionState = Literal["opened", "updated", "resolved"]


@dataclass(frozen=True, slots=True)
class SilentTransition:
    """One lifecycle event of a silent breach."""

    breach_id: str
    seq: int
    state: TransitionState
    severity: str
    at_ms: int
    opened_ms: int
    resolved_ms: int | None
    #: The short window's figures next to the baseline's.
    sli: dict[str, float | None] = field(default_factory=dict)
    #: Cause rates of the baseline (for the attribution's lift).
    baseline_factor_rates: tuple[float, ...] = ()
    baseline_stage_p99_ms: Mapping[str, float] = field(default_factory=dict)

    @property
    def event_id(self) -> str:
        return f"{self.breach_id}:{self.seq}"


def silent_breach_id(series_key: str, opened_ms: int) -> str:
    ident = f"{series_key}|{KIND}|{opened_ms}"
    return hashlib.blake2b(ident.encode(), digest_size=12).hexdigest()


def _fires(short: WindowStats, base: Baseline, policy: SilentPolicy) -> bool:
    if base.minutes < policy.min_baseline_minutes or short.requests < policy.min_requests:
        return False
    if base.p95_ttft_ms is None or short.p95_ttft_ms is None or base.rate_rps <= 0:
        return False
    return (
        short.attainment <= base.attainment - policy.attainment_drop
        and short.p95_ttft_ms >= policy.p95_rise * base.p95_ttft_ms
        and short.error_rate <= base.error_rate + policy.error_band
        and abs(short.rate_rps / base.rate_rps - 1.0) <= policy.rate_band
    )


def _anomalous(minute: WindowStats, base: Baseline, policy: SilentPolicy) -> bool:
    """A minute that should not teach the baseline (its own figures look like an incident)."""
    if base.minutes < policy.min_baseline_minutes:
        return False
    if minute.attainment <= base.attainment - policy.attainment_drop:
        return True
    return (
        base.p95_ttft_ms is not None
        and minute.p95_ttft_ms is not None
        and minute.p95_ttft_ms >= policy.p95_rise * base.p95_ttft_ms
    )


def _ewma(old: float, new: float, weight: float) -> float:
    return old + weight * (new - old)


def _learn(base: Baseline, minute: WindowStats, policy: SilentPolicy) -> Baseline:
    n = base.minutes + 1
    w = max(1.0 / n, policy.alpha)
    p95 = minute.p95_ttft_ms
    if p95 is None or not math.isfinite(p95):
        p95_new = base.p95_ttft_ms
    elif base.p95_ttft_ms is None:
        p95_new = p95
    else:
        p95_new = _ewma(base.p95_ttft_ms, p95, w)
    stages = dict(base.stage_p99_ms)
    for stage, value in minute.stage_p99_ms.items():
        old = stages.get(stage)
        stages[stage] = value if old is None else _ewma(old, value, w)
    return Baseline(
        minutes=n,
        attainment=_ewma(base.attainment, minute.attainment, w),
        error_rate=_ewma(base.error_rate, minute.error_rate, w),
        rate_rps=_ewma(base.rate_rps, minute.rate_rps, w),
        p95_ttft_ms=p95_new,
        factor_rates=[
            _ewma(old, new, w)
            for old, new in zip(base.factor_rates, minute.factor_rates, strict=True)
        ],
        stage_p99_ms=stages,
    )


def _sli(short: WindowStats, base: Baseline) -> dict[str, float | None]:
    return {
        "attainment": round(short.attainment, 6),
        "baseline_attainment": round(base.attainment, 6),
        "p95_ttft_ms": None if short.p95_ttft_ms is None else round(short.p95_ttft_ms, 1),
        "baseline_p95_ttft_ms": None if base.p95_ttft_ms is None else round(base.p95_ttft_ms, 1),
        "error_rate": round(short.error_rate, 6),
        "baseline_error_rate": round(base.error_rate, 6),
        "rate_rps": round(short.rate_rps, 3),
        "baseline_rate_rps": round(base.rate_rps, 3),
        "requests": float(short.requests),
    }


def advance_silent(
    state: SilentState,
    end_ms: int,
    minute: WindowStats,
    short: WindowStats,
    policy: SilentPolicy,
) -> tuple[SilentState, list[SilentTransition]]:
    """Judge the short window ending at the closed minute ``end_ms``; learn the minute.

    An evaluation point not later than the last one seen changes nothing.
    """
    if state.last_at_ms is not None and end_ms <= state.last_at_ms:
        return state, []
    base = state.baseline
    fires = _fires(short, base, policy)
    out: list[SilentTransition] = []
    new = replace_state(state, last_at_ms=end_ms)
    drop = base.attainment - short.attainment
    severity = "page" if drop >= policy.page_drop else "ticket"

    def transition(
        bid: str,
        seq: int,
        what: TransitionState,  # a name: the annotation is evaluated at every call
        sev: str,
        opened: int,
        resolved: int | None,
    ) -> SilentTransition:
        return SilentTransition(
            bid,
            seq,
            what,
            sev,
            end_ms,
            opened,
            resolved,
            _sli(short, base),
            tuple(base.factor_rates),
            dict(base.stage_p99_ms),
        )

    if fires and not state.is_open:
        bid = silent_breach_id(state.series_key, end_ms)
        new = replace_state(
            new,
            breach_id=bid,
            seq=0,
            opened_ms=end_ms,
            last_fired_ms=end_ms,
            last_transition_ms=end_ms,
            attainment_at_transition=short.attainment,
            severity=severity,
        )
        out.append(transition(bid, 0, "opened", severity, end_ms, None))
    elif fires and state.is_open:
        new = replace_state(new, last_fired_ms=end_ms)
        assert state.breach_id is not None and state.opened_ms is not None
        worse = (state.attainment_at_transition or 1.0) - short.attainment >= policy.material_drop
        escalates = severity == "page" and state.severity != "page"
        since = end_ms - (state.last_transition_ms or end_ms)
        if escalates or (worse and since >= policy.update_interval_ms):
            seq = state.seq + 1
            new = replace_state(
                new,
                seq=seq,
                last_transition_ms=end_ms,
                attainment_at_transition=short.attainment,
                severity="page" if escalates else state.severity,
            )
            out.append(
                transition(
                    state.breach_id, seq, "updated", new.severity or severity, state.opened_ms, None
                )
            )
    elif state.is_open and end_ms - (state.last_fired_ms or end_ms) >= policy.resolve_hold_ms:
        assert state.breach_id is not None and state.opened_ms is not None
        seq = state.seq + 1
        out.append(
            transition(
                state.breach_id,
                seq,
                "resolved",
                state.severity or "ticket",
                state.opened_ms,
                end_ms,
            )
        )
        new = replace_state(
            new,
            breach_id=None,
            seq=0,
            opened_ms=None,
            last_fired_ms=None,
            last_transition_ms=None,
            attainment_at_transition=None,
            severity=None,
        )
    if (
        not new.is_open
        and not fires
        and minute.requests >= policy.min_minute_requests
        and not _anomalous(minute, base, policy)
    ):
        new = replace_state(new, baseline=_learn(base, minute, policy))
    return new, out


def replace_state(state: SilentState, **changes: Any) -> SilentState:
    """A copy of ``state`` with ``changes`` (msgspec structs are not dataclasses)."""
    return msgspec.structs.replace(state, **changes)


def factor_rates(counters: Any) -> tuple[float, ...]:
    """Share of a window's ok requests with each cause flag."""
    ok = counters.requests - counters.errors - counters.cancelled
    if ok <= 0:
        return tuple(0.0 for _ in FACTORS)
    return tuple(counters.factor_row(i)[0] / ok for i in range(len(FACTORS)))


def stats_of(
    counters: Any,
    window_ms: int,
    p95_ttft_ms: float | None,
    stage_p99_ms: Mapping[str, float],
) -> WindowStats:
    """The :class:`WindowStats` of a merged window's counters and quantiles."""
    return WindowStats(
        window_ms=window_ms,
        requests=counters.requests,
        errors=counters.errors,
        good=counters.good_requests,
        p95_ttft_ms=p95_ttft_ms,
        factor_rates=factor_rates(counters),
        stage_p99_ms=dict(stage_p99_ms),
    )
