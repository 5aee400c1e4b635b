"""The MoE expert circuit breaker's state machine."""

import pytest
from tailguard.streams.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    Breaker,
    BreakerPolicy,
    ExpertBreakers,
)

POLICY = BreakerPolicy(window=100, min_requests=20, cooldown_ms=1_000, probe_requests=5)


def feed(
    b: Breaker, n: int, *, ok: bool = True, ms: float = 100.0, t0: int = 0, dt: int = 10
) -> list:
    return [t for i in range(n) if (t := b.observe(ok, ms, t0 + i * dt)) is not None]


def test_healthy_expert_stays_closed() -> None:
    b = Breaker(1, POLICY)
    assert feed(b, 500) == [] and b.state == CLOSED


def test_error_rate_over_fifteen_percent_opens_within_the_window() -> None:
    b = Breaker(1, POLICY)
    feed(b, 100)
    ts = []
    for i in range(100):
        t = b.observe(i % 4 != 0, 100.0, 2_000 + i)  # 25% errors
        if t:
            ts.append((i, t))
    assert ts and ts[0][1].after == OPEN and ts[0][0] < 100
    assert ts[0][1].evidence["error_rate"] > 0.15


def test_exactly_fifteen_percent_does_not_open() -> None:
    b = Breaker(1, BreakerPolicy(min_requests=100))
    pattern = [i % 20 >= 3 for i in range(300)]  # every window of 100 holds 15 errors
    assert [t for i, ok in enumerate(pattern) if (t := b.observe(ok, 100.0, i))] == []


def test_slow_p99_opens() -> None:
    b = Breaker(1, POLICY)
    feed(b, 80)
    trans = feed(b, 20, ms=2_000.0, t0=1_000)
    assert trans and trans[0].after == OPEN and trans[0].evidence["p99_ms"] > 800


def test_open_half_open_closed_on_recovery() -> None:
    b = Breaker(1, POLICY)
    opened = feed(b, 30, ok=False)
    assert [t.after for t in opened] == [OPEN]
    opened_at = opened[0].ts_ms
    assert feed(b, 5, ok=True, t0=opened_at + 10, dt=10) == []  # still cooling down
    trans = feed(b, 5, ok=True, t0=opened_at + 1_000)
    assert [(t.before, t.after) for t in trans] == [(OPEN, HALF_OPEN), (HALF_OPEN, CLOSED)]
    assert b.state == CLOSED


def test_failing_probes_reopen() -> None:
    b = Breaker(1, POLICY)
    feed(b, 30, ok=False)
    trans = feed(b, 5, ok=False, t0=10_000)
    assert [(t.before, t.after) for t in trans] == [(OPEN, HALF_OPEN), (HALF_OPEN, OPEN)]
    assert b.opened_ms == 10_040


def test_fallback_share_is_the_traffic_of_open_experts() -> None:
    eb = ExpertBreakers(BreakerPolicy(min_requests=20, cooldown_ms=10**9, share_window=100))
    for i in range(100):
        expert = i % 4
        eb.observe([expert], expert != 3, 100.0, i)
    assert eb.breakers[3].state == OPEN
    assert eb.fallback_share() == pytest.approx(0.25)
    assert eb.states() == {"3": OPEN}
