"""Capacity: per-interval load of a deployment, scaling decisions, warm-up reports.

Load per interval (event time, so a replay gives the same decisions)::

    interval  [t0 ─────────────── t0 + L)        closed once an event at
              │  req  req   req  req  │           ≥ t0 + L + grace arrives
    concurrency  = Σ e2e_ms / L        (Little's law: N = λ·W = (n/L)·mean W)
    P95          = 95th percentile of e2e_ms of the requests that arrived
    tokens/s     = Σ output_tokens / (L / 1000)

Scaling decision tree (docs/capacity.md), evaluated once per closed interval::

    no knee yet ........................................ hold (no_knee)
    concurrency ≥ up_factor·knee for up_intervals in a row
        last action a scale_up, less than settle_ms ago  hold (settling)
        in cool-down ................................... hold (cooldown)
        the overload episode of the last scale_up lasts  scale_up (overload_persists)
        else ........................................... scale_up (threshold)
    util < util_below_pct and concurrency < down_factor·knee
        for down_intervals in a row
        util unknown ................................... hold (util_unknown)
        resident memory > mem_ceiling ................... hold (weights_resident)
        last action a scale_down, less than settle_ms ago hold (settling)
        in cool-down ................................... hold (cooldown)
        the low-load episode of the last scale_down lasts scale_down (underload_persists)
        else ........................................... scale_down (threshold)
    otherwise .......................................... hold (steady)

One recommendation per episode. The same recommendation is repeated only
when the condition still holds ``settle_ms`` (5 min) after the last one — the
time a new LLM replica needs to start, load its weights and warm up, so the
first recommendation could have taken effect (Kubernetes' HPA uses the same
300 s as its scale-down stabilisation window). Until then, more of the same
load is the load already answered, even when it dipped in between (real
traffic measured in 10 s intervals does). A cool-down (``cooldown_ms``,
event time) separates any two actions, so a load hovering at a threshold
cannot flap. A repeat says whether the episode lasted: a scale_up opens an
*overload episode* that ends when concurrency falls below
``up_rearm_factor``·knee (default: back at the knee, 20 % under the
trigger), a scale_down a *low-load episode* that ends when concurrency rises
to ``down_rearm_factor``·knee; a repeat within the episode is
``overload_persists`` / ``underload_persists``, after it ``threshold``.
Before, a ramp that stayed above 1.2 × knee for two minutes got a scale_up
after every 60 s cool-down::

    concurrency  ──────╱▔▔▔▔▔▔▔▔▔▔▔▔╲____________
    before             ↑up   ↑up   ↑up  ↓down ↓down ↓down
    now                ↑up (episode)     ↓down (episode)

Each decision's evidence carries ``capacity_factor`` = concurrency / knee:
the multiple of today's capacity that would bring the load back to the knee
(1.4 ⇒ add 40 %; 0.25 ⇒ a quarter would do).

"CPU" utilisation in the scale-down rule is
read as the serving accelerator's utilisation (``util_gpu_pct`` of the GPUs
the deployment's requests name, from ``tailguard.gpu``); memory is their
``mem_used_mib / mem_total_mib`` (the resident weights plus KV cache — an upper
bound of the weights, so the guard errs on the side of not scaling down).
"""

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tailguard.streams.errors import ConfigError
from tailguard.streams.knee import LoadSample

__all__ = [
    "HOLD",
    "SCALE_DOWN",
    "SCALE_UP",
    "Decision",
    "IntervalLoad",
    "LoadWindow",
    "OpenInterval",
    "ScalePolicy",
    "ScaleState",
    "WarmupReport",
    "WarmupTracker",
    "decide",
]

#: Past any event time (and far from overflowing when an interval is added to it).
_NEVER = np.iinfo(np.int64).max // 2

SCALE_UP = "scale_up"
SCALE_DOWN = "scale_down"
HOLD = "hold"


@dataclass(slots=True)
class OpenInterval:
    """The values and tokens an open load interval has gathered so far."""

    e2e: list[float] = field(default_factory=list)
    tokens: int = 0
    #: The first ``saved`` values of ``e2e`` are stored already, in segments
    #: (:func:`~tailguard.streams.capacity_state.take_segment`).
    saved: int = 0


@dataclass(slots=True)
class IntervalLoad:
    """One closed interval: the load sample plus the request count."""

    start_ms: int
    end_ms: int
    requests: int
    sample: LoadSample


@dataclass(slots=True)
class LoadWindow:
    """Event-time intervals of one deployment; late requests are counted, not merged."""

    interval_ms: int = 10_000
    grace_ms: int = 2_000
    open: dict[int, OpenInterval] = field(default_factory=dict)
    closed_through: int = -1
    late: int = 0

    def add(self, ts_ms: int, e2e_ms: float, output_tokens: int) -> list[IntervalLoad]:
        """Add one request; return the intervals this closed (oldest first)."""
        start = ts_ms - ts_ms % self.interval_ms
        if start <= self.closed_through:
            self.late += 1
            return []
        slot = self.open.get(start)
        if slot is None:
            slot = self.open[start] = OpenInterval()
        slot.e2e.append(e2e_ms)
        slot.tokens += output_tokens
        watermark = ts_ms - self.grace_ms
        if watermark < min(self.open) + self.interval_ms:
            return []  # the oldest open interval is not over yet
        return self._close(watermark)

    def add_many(
        self, ts_ms: np.ndarray, e2e_ms: np.ndarray, output_tokens: np.ndarray
    ) -> list[tuple[int, IntervalLoad]]:
        """:meth:`add` of each request in order, one numpy pass per request that
        closes intervals: the intervals closed, each with the index of that request.

        Between two closes nothing changes what counts as late (``closed_through``),
        so a request closes intervals where its watermark reaches the end of the
        oldest interval open at that point: the open ones' oldest, or an earlier
        request's of the same stretch (a running minimum)."""
        out: list[tuple[int, IntervalLoad]] = []
        width = self.interval_ms
        starts = ts_ms - ts_ms % width
        marks = ts_ms - self.grace_ms
        at, n = 0, len(starts)
        while at < n:
            rest = starts[at:]
            late = rest <= self.closed_through
            oldest = np.minimum.accumulate(np.where(late, _NEVER, rest))
            if self.open:
                oldest = np.minimum(oldest, min(self.open))
            closing = np.flatnonzero(~late & (marks[at:] >= oldest + width))
            stop = at + int(closing[0]) + 1 if closing.size else n
            self.late += int(np.count_nonzero(late[: stop - at]))
            kept = np.flatnonzero(~late[: stop - at]) + at
            self._extend(starts[kept], e2e_ms[kept], output_tokens[kept])
            if closing.size:
                out.extend((stop - 1, closed) for closed in self._close(int(marks[stop - 1])))
            at = stop
        return out

    def _extend(self, starts: np.ndarray, e2e_ms: np.ndarray, tokens: np.ndarray) -> None:
        """Requests (none late) into their open intervals, in order."""
        if not starts.size:
            return
        for start in np.unique(starts).tolist():
            mine = starts == start
            slot = self.open.get(start)
            if slot is None:
                slot = self.open[start] = OpenInterval()
            slot.e2e.extend(e2e_ms[mine].tolist())
            slot.tokens += int(tokens[mine].sum())

    def _close(self, watermark: int) -> list[IntervalLoad]:
        out: list[IntervalLoad] = []
        for start in sorted(self.open):
            end = start + self.interval_ms
            if end > watermark:
                break
            slot = self.open.pop(start)
            e2e = np.asarray(slot.e2e, dtype=np.float64)
            sample = LoadSample(
                ts_ms=end,
                concurrency=float(e2e.sum()) / self.interval_ms,
                p95_ms=float(np.percentile(e2e, 95)),
                tokens_per_s=slot.tokens * 1000.0 / self.interval_ms,
            )
            out.append(IntervalLoad(start, end, len(slot.e2e), sample))
            self.closed_through = start
        return out


@dataclass(frozen=True, slots=True)
class ScalePolicy:
    """Thresholds of the scaling decision tree (defaults: docs/capacity.md)."""

    up_factor: float = 1.2
    down_factor: float = 0.6
    util_below_pct: float = 40.0
    down_intervals: int = 3
    up_intervals: int = 1
    mem_ceiling: float = 0.85
    #: Least event time between any two actions (anti-flap).
    cooldown_ms: int = 60_000
    #: Within one episode, repeat a recommendation only this long after the last
    #: (the time new capacity needs to take effect; see the module docstring).
    settle_ms: int = 300_000
    #: An overload episode ends when concurrency < up_rearm_factor·knee.
    up_rearm_factor: float = 1.0
    #: A low-load episode ends when concurrency ≥ down_rearm_factor·knee.
    down_rearm_factor: float = 0.8

    def __post_init__(self) -> None:
        if not 0 < self.down_factor < 1 < self.up_factor:
            msg = "need 0 < down_factor < 1 < up_factor (a dead band between them)"
            raise ConfigError(msg)
        if self.down_intervals < 1 or self.up_intervals < 1:
            msg = "down_intervals and up_intervals must be ≥ 1"
            raise ConfigError(msg)
        if not 0 < self.mem_ceiling <= 1:
            msg = f"mem_ceiling is a fraction in (0, 1], got {self.mem_ceiling}"
            raise ConfigError(msg)
        if self.cooldown_ms < 0 or self.settle_ms < self.cooldown_ms:
            msg = "need 0 ≤ cooldown_ms ≤ settle_ms"
            raise ConfigError(msg)
        if not self.down_factor <= self.down_rearm_factor <= self.up_rearm_factor <= self.up_factor:
            msg = "need down_factor ≤ down_rearm_factor ≤ up_rearm_factor ≤ up_factor"
            raise ConfigError(msg)


@dataclass(slots=True)
class ScaleState:
    """The hysteresis state of one deployment."""

    high_streak: int = 0
    low_streak: int = 0
    last_action_ms: int | None = None
    last_action: str | None = None
    #: SCALE_UP during an overload episode that got its scale_up, SCALE_DOWN during
    #: a low-load episode that got its scale_down, else None.
    episode: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """A scaling verdict with everything it was decided from."""

    decision: str
    reason: str
    evidence: dict[str, Any]

    @property
    def actionable(self) -> bool:
        return self.decision != HOLD


def decide(
    policy: ScalePolicy,
    state: ScaleState,
    *,
    ts_ms: int,
    concurrency: float,
    knee: float | None,
    util_pct: float | None,
    mem_fraction: float | None,
) -> Decision:
    """One step of the decision tree (mutates ``state``); see the module docstring."""
    evidence: dict[str, Any] = {
        "concurrency": round(concurrency, 4),
        "knee": None if knee is None else round(knee, 4),
        "util_pct": util_pct,
        "mem_fraction": None if mem_fraction is None else round(mem_fraction, 4),
        "up_threshold": None if knee is None else round(policy.up_factor * knee, 4),
        "down_threshold": None if knee is None else round(policy.down_factor * knee, 4),
        "policy": {
            "up_factor": policy.up_factor,
            "down_factor": policy.down_factor,
            "util_below_pct": policy.util_below_pct,
            "down_intervals": policy.down_intervals,
            "up_intervals": policy.up_intervals,
            "mem_ceiling": policy.mem_ceiling,
            "cooldown_ms": policy.cooldown_ms,
            "settle_ms": policy.settle_ms,
            "up_rearm_factor": policy.up_rearm_factor,
            "down_rearm_factor": policy.down_rearm_factor,
        },
    }

    def out(decision: str, reason: str) -> Decision:
        evidence["high_streak"] = state.high_streak
        evidence["low_streak"] = state.low_streak
        evidence["last_action_ms"] = state.last_action_ms
        evidence["last_action"] = state.last_action
        evidence["episode"] = state.episode
        return Decision(decision, reason, evidence)

    if knee is None or knee <= 0:
        state.high_streak = state.low_streak = 0
        return out(HOLD, "no_knee")
    evidence["capacity_factor"] = round(concurrency / knee, 4)
    # Episodes end on the far side of their hysteresis band.
    over = state.episode == SCALE_UP and concurrency < policy.up_rearm_factor * knee
    if over or (state.episode == SCALE_DOWN and concurrency >= policy.down_rearm_factor * knee):
        state.episode = None
    since = None if state.last_action_ms is None else ts_ms - state.last_action_ms
    cooling = since is not None and since < policy.cooldown_ms
    settling = since is not None and since < policy.settle_ms
    if concurrency >= policy.up_factor * knee:
        state.low_streak = 0
        state.high_streak += 1
        if state.high_streak < policy.up_intervals:
            return out(HOLD, "high_pending")
        if settling and state.last_action == SCALE_UP:
            return out(HOLD, "settling")
        if cooling:
            return out(HOLD, "cooldown")
        persists = state.episode == SCALE_UP
        return _act(state, ts_ms, SCALE_UP, out, "overload_persists" if persists else "threshold")
    state.high_streak = 0
    low_load = concurrency < policy.down_factor * knee
    if not low_load:
        state.low_streak = 0
        return out(HOLD, "steady")
    if util_pct is None:
        state.low_streak = 0
        return out(HOLD, "util_unknown")
    if util_pct >= policy.util_below_pct:
        state.low_streak = 0
        return out(HOLD, "util_high")
    state.low_streak += 1
    if state.low_streak < policy.down_intervals:
        return out(HOLD, "low_pending")
    if mem_fraction is not None and mem_fraction > policy.mem_ceiling:
        return out(HOLD, "weights_resident")
    if settling and state.last_action == SCALE_DOWN:
        return out(HOLD, "settling")
    if cooling:
        return out(HOLD, "cooldown")
    persists = state.episode == SCALE_DOWN
    return _act(state, ts_ms, SCALE_DOWN, out, "underload_persists" if persists else "threshold")


def _act(
    state: ScaleState, ts_ms: int, action: str, out: Any, reason: str = "threshold"
) -> Decision:
    decision: Decision = out(action, reason)  # evidence: the streaks that led here
    state.high_streak = state.low_streak = 0
    state.last_action_ms = ts_ms
    state.last_action = action
    state.episode = decision.evidence["episode"] = action
    return decision


# ------------------------------------------------------------------ warm-up


@dataclass(frozen=True, slots=True)
class WarmupReport:
    """First-token latency of one instance before and after its warm-up."""

    instance: str
    warmup_requests: int
    warm_requests: int
    before_ttft_p50_ms: float
    after_ttft_p50_ms: float
    before_ttft_p95_ms: float
    after_ttft_p95_ms: float

    @property
    def effective(self) -> bool:
        return self.after_ttft_p50_ms < self.before_ttft_p50_ms

    def evidence(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "warmup_requests": self.warmup_requests,
            "warm_requests": self.warm_requests,
            "before_ttft_p50_ms": round(self.before_ttft_p50_ms, 3),
            "after_ttft_p50_ms": round(self.after_ttft_p50_ms, 3),
            "before_ttft_p95_ms": round(self.before_ttft_p95_ms, 3),
            "after_ttft_p95_ms": round(self.after_ttft_p95_ms, 3),
            "speedup": round(self.before_ttft_p50_ms / max(self.after_ttft_p50_ms, 1e-9), 3),
            "effective": self.effective,
        }


@dataclass(slots=True)
class WarmupTracker:
    """Per instance: TTFTs of warm-up requests, then of the first ``after`` regular ones.

    Reported once per instance, when ``after`` regular requests followed at
    least one warm-up request (the article: 1.2 s → 210 ms).
    """

    after: int = 20
    before: dict[str, list[float]] = field(default_factory=dict)
    warm: dict[str, list[float]] = field(default_factory=dict)
    reported: set[str] = field(default_factory=set)

    def add(self, instance: str, warmup: bool, ttft_ms: float | None) -> WarmupReport | None:
        if ttft_ms is None or instance in self.reported:
            return None
        if warmup:
            self.before.setdefault(instance, []).append(ttft_ms)
            return None
        if instance not in self.before:
            return None  # never warmed up (or warmed before we watched): nothing to compare
        after = self.warm.setdefault(instance, [])
        after.append(ttft_ms)
        if len(after) < self.after:
            return None
        self.reported.add(instance)
        b = np.asarray(self.before.pop(instance))
        a = np.asarray(self.warm.pop(instance))
        return WarmupReport(
            instance,
            len(b),
            len(a),
            float(np.percentile(b, 50)),
            float(np.percentile(a, 50)),
            float(np.percentile(b, 95)),
            float(np.percentile(a, 95)),
        )
