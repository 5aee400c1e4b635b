"""MoE expert circuit breaker (docs/capacity.md).

One breaker per expert id, fed by every request whose ``expert_ids`` name it::

    closed ──(window of the last `window` requests: error rate > max_error_rate
     ▲         or P99 > max_p99_ms, with ≥ min_requests)──▶ open
     │                                                        │ event time ≥ opened + cooldown_ms
     │                                                        ▼
     └──(probe_requests probes healthy)────────────────── half_open
                                       (a probe set unhealthy) ──▶ open again

Requests seen while open (before the cool-down ends) are not counted: the
fallback router is meant to take that traffic. :class:`ExpertBreakers` also
tracks each expert's share of the deployment's recent requests, so the share
of traffic the fallback router must absorb can be published.
"""

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tailguard.streams.errors import ConfigError

__all__ = [
    "CLOSED",
    "HALF_OPEN",
    "OPEN",
    "Breaker",
    "BreakerPolicy",
    "ExpertBreakers",
    "Transition",
]

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    window: int = 100
    max_error_rate: float = 0.15
    max_p99_ms: float = 800.0
    min_requests: int = 20
    cooldown_ms: int = 30_000
    probe_requests: int = 10
    #: Share of an expert's traffic let through while half-open.
    probe_share: float = 0.05
    #: Requests of the deployment over which expert traffic shares are measured.
    share_window: int = 1000

    def __post_init__(self) -> None:
        if not 1 <= self.min_requests <= self.window:
            msg = "need 1 ≤ min_requests ≤ window"
            raise ConfigError(msg)
        if not 0 < self.max_error_rate < 1 or self.max_p99_ms <= 0:
            msg = "max_error_rate must be in (0, 1) and max_p99_ms > 0"
            raise ConfigError(msg)
        if self.probe_requests < 1 or self.cooldown_ms < 0:
            msg = "probe_requests must be ≥ 1 and cooldown_ms ≥ 0"
            raise ConfigError(msg)


@dataclass(frozen=True, slots=True)
class Transition:
    """A state change with the window it was decided on."""

    expert: int
    before: str
    after: str
    ts_ms: int
    evidence: dict[str, Any]


def _health(window: deque[tuple[bool, float]] | list[tuple[bool, float]]) -> tuple[float, float]:
    errors = sum(1 for ok, _ in window if not ok)
    p99 = float(np.percentile(np.fromiter((ms for _, ms in window), np.float64), 99))
    return errors / len(window), p99


@dataclass(slots=True)
class Breaker:
    expert: int
    policy: BreakerPolicy = field(default_factory=BreakerPolicy)
    state: str = CLOSED
    window: deque[tuple[bool, float]] = field(default_factory=deque)
    probes: list[tuple[bool, float]] = field(default_factory=list)
    opened_ms: int | None = None
    seen: int = 0
    #: Errors and requests over ``max_p99_ms`` in ``window`` (kept incrementally).
    errors: int = 0
    slow: int = 0

    def _unhealthy(self, err: float, p99: float) -> bool:
        return err > self.policy.max_error_rate or p99 > self.policy.max_p99_ms

    def _move(self, to: str, ts_ms: int, err: float, p99: float, n: int) -> Transition:
        before, self.state = self.state, to
        ev = {
            "error_rate": round(err, 4),
            "p99_ms": round(p99, 3),
            "requests": n,
            "requests_seen": self.seen,
            "max_error_rate": self.policy.max_error_rate,
            "max_p99_ms": self.policy.max_p99_ms,
            "window": self.policy.window,
            "cooldown_ms": self.policy.cooldown_ms,
        }
        return Transition(self.expert, before, to, ts_ms, ev)

    def observe(self, ok: bool, latency_ms: float, ts_ms: int) -> Transition | None:
        """Feed one request that this expert served; return a transition if one happened."""
        self.seen += 1
        p = self.policy
        if self.state == OPEN:
            assert self.opened_ms is not None
            if ts_ms - self.opened_ms < p.cooldown_ms:
                return None
            self.probes = []
            t = self._move(HALF_OPEN, ts_ms, 0.0, 0.0, 0)
            self.state = HALF_OPEN
            # This request is the first probe.
            self.probes.append((ok, latency_ms))
            return t
        if self.state == HALF_OPEN:
            self.probes.append((ok, latency_ms))
            if len(self.probes) < p.probe_requests:
                return None
            err, p99 = _health(self.probes)
            n = len(self.probes)
            if self._unhealthy(err, p99):
                self.opened_ms = ts_ms
                self.probes = []
                return self._move(OPEN, ts_ms, err, p99, n)
            self._reset(self.probes)
            self.probes = []
            self.opened_ms = None
            return self._move(CLOSED, ts_ms, err, p99, n)
        self._push(ok, latency_ms)
        n = len(self.window)
        if n < p.min_requests:
            return None
        # O(1) gate: with no request over the P99 limit, P99 cannot exceed it.
        if self.errors <= p.max_error_rate * n and self.slow == 0:
            return None
        err, p99 = _health(self.window)
        if self._unhealthy(err, p99):
            self._reset([])
            self.opened_ms = ts_ms
            return self._move(OPEN, ts_ms, err, p99, n)
        return None

    def _push(self, ok: bool, latency_ms: float) -> None:
        self.window.append((ok, latency_ms))
        self.errors += not ok
        self.slow += latency_ms > self.policy.max_p99_ms
        while len(self.window) > self.policy.window:
            old_ok, old_ms = self.window.popleft()
            self.errors -= not old_ok
            self.slow -= old_ms > self.policy.max_p99_ms

    def _reset(self, values: list[tuple[bool, float]]) -> None:
        self.window = deque()
        self.errors = self.slow = 0
        for ok, ms in values:
            self._push(ok, ms)


@dataclass(slots=True)
class ExpertBreakers:
    """The breakers of one deployment and its recent traffic per expert."""

    policy: BreakerPolicy = field(default_factory=BreakerPolicy)
    breakers: dict[int, Breaker] = field(default_factory=dict)
    recent: deque[tuple[int, ...]] = field(default_factory=deque)

    def observe(
        self, expert_ids: list[int], ok: bool, latency_ms: float, ts_ms: int
    ) -> list[Transition]:
        if not expert_ids:
            return []
        self.recent.append(tuple(expert_ids))
        while len(self.recent) > self.policy.share_window:
            self.recent.popleft()
        out = []
        for e in expert_ids:
            b = self.breakers.get(e)
            if b is None:
                b = self.breakers[e] = Breaker(e, self.policy)
            t = b.observe(ok, latency_ms, ts_ms)
            if t is not None:
                out.append(t)
        return out

    def fallback_share(self) -> float:
        """Share of recent requests that touch an open expert (half-open: all but probes)."""
        if not self.recent:
            return 0.0
        weight = {
            e: 1.0 if b.state == OPEN else 1.0 - self.policy.probe_share
            for e, b in self.breakers.items()
            if b.state != CLOSED
        }
        if not weight:
            return 0.0
        total = sum(max((weight.get(e, 0.0) for e in ids), default=0.0) for ids in self.recent)
        return total / len(self.recent)

    def states(self) -> dict[str, str]:
        return {str(e): b.state for e, b in sorted(self.breakers.items()) if b.state != CLOSED}
