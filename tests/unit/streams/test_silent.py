"""Silent SLO collapse: baseline learning, the firing rule and the breach lifecycle."""

import msgspec
import pytest
from tailguard.streams.errors import ConfigError
from tailguard.streams.silent import (
    SilentPolicy,
    SilentState,
    WindowStats,
    advance_silent,
    silent_breach_id,
)

MIN = 60_000
T0 = 1_700_000_040_000 - 1_700_000_040_000 % MIN
POLICY = SilentPolicy()


def stats(
    window_ms: int,
    *,
    rps: float = 20.0,
    attainment: float = 0.9998,
    error_rate: float = 0.002,
    p95: float = 320.0,
    miss: float = 0.013,
    stages: dict[str, float] | None = None,
) -> WindowStats:
    requests = round(rps * window_ms / 1000)
    return WindowStats(
        window_ms=window_ms,
        requests=requests,
        errors=round(error_rate * requests),
        good=round(attainment * requests),
        p95_ttft_ms=p95,
        factor_rates=(miss, 0.001, 0.0),
        stage_p99_ms=stages if stages is not None else {"prefill": 250.0, "queue": 40.0},
    )


def healthy(minutes: int, start: int = 0, state: SilentState | None = None) -> SilentState:
    state = state or SilentState(series_key="chat|m|default|acme")
    for i in range(start, start + minutes):
        state, out = advance_silent(
            state, T0 + (i + 1) * MIN, stats(MIN), stats(POLICY.short_window_ms), POLICY
        )
        assert out == []
    return state


def collapsed(window_ms: int, **kw: float) -> WindowStats:
    fields = {"attainment": 0.412, "p95": 1_840.0, "miss": 0.93}
    fields.update(kw)
    return stats(window_ms, stages={"prefill": 1_700.0, "queue": 900.0}, **fields)


def test_the_baseline_learns_healthy_minutes() -> None:
    state = healthy(20)
    base = state.baseline
    assert base.minutes == 20
    assert base.p95_ttft_ms == pytest.approx(320.0)
    assert base.rate_rps == pytest.approx(20.0)
    assert base.factor_rates[0] == pytest.approx(0.013)
    assert base.stage_p99_ms == {"prefill": pytest.approx(250.0), "queue": pytest.approx(40.0)}


def test_the_articles_collapse_opens_a_silent_breach_at_the_first_closed_minute() -> None:
    state = healthy(20)
    end = T0 + 21 * MIN
    state, out = advance_silent(state, end, collapsed(MIN), collapsed(5 * MIN), POLICY)
    assert [t.state for t in out] == ["opened"]
    t = out[0]
    assert t.breach_id == silent_breach_id("chat|m|default|acme", end)
    assert t.severity == "page"  # attainment fell by far more than page_drop
    assert t.sli["attainment"] == pytest.approx(0.412)
    assert t.sli["baseline_p95_ttft_ms"] == pytest.approx(320.0)
    assert t.baseline_factor_rates[0] == pytest.approx(0.013)
    assert state.is_open


def test_errors_rising_with_latency_is_not_silent() -> None:
    state = healthy(20)
    loud = collapsed(5 * MIN, error_rate=0.08)
    _, out = advance_silent(state, T0 + 21 * MIN, collapsed(MIN, error_rate=0.08), loud, POLICY)
    assert out == []


def test_a_traffic_surge_is_not_silent() -> None:
    state = healthy(20)
    surge = collapsed(5 * MIN, rps=45.0)
    _, out = advance_silent(state, T0 + 21 * MIN, collapsed(MIN, rps=45.0), surge, POLICY)
    assert out == []


def test_nothing_is_judged_before_the_baseline_is_learned() -> None:
    state = healthy(POLICY.min_baseline_minutes - 1)
    _, out = advance_silent(state, T0 + 30 * MIN, collapsed(MIN), collapsed(5 * MIN), POLICY)
    assert out == []


def test_a_quiet_series_is_not_judged() -> None:
    state = healthy(20)
    quiet = collapsed(5 * MIN, rps=0.1)  # 30 requests in 5 minutes: under min_requests
    _, out = advance_silent(state, T0 + 21 * MIN, collapsed(MIN, rps=0.1), quiet, POLICY)
    assert out == []


def test_it_resolves_after_the_hold_and_the_incident_never_became_the_baseline() -> None:
    state = healthy(20)
    transitions = []
    minute = 21
    for _ in range(6):  # six collapsed minutes
        state, out = advance_silent(
            state, T0 + minute * MIN, collapsed(MIN), collapsed(5 * MIN), POLICY
        )
        transitions += out
        minute += 1
    assert state.baseline.minutes == 20
    assert state.baseline.p95_ttft_ms == pytest.approx(320.0)
    last_fired = T0 + (minute - 1) * MIN
    while state.is_open:
        state, out = advance_silent(state, T0 + minute * MIN, stats(MIN), stats(5 * MIN), POLICY)
        transitions += out
        minute += 1
        assert minute < 60
    assert [t.state for t in transitions] == ["opened", "resolved"]
    resolved = transitions[-1]
    assert resolved.resolved_ms == last_fired + POLICY.resolve_hold_ms
    assert resolved.event_id == f"{resolved.breach_id}:1"
    assert resolved.breach_id == transitions[0].breach_id


def test_a_deeper_fall_is_an_update_no_sooner_than_the_update_interval() -> None:
    policy = SilentPolicy(page_drop=0.9)  # stay a ticket: only the attainment fall updates
    state = healthy(20)
    out_all = []
    attainments = [0.85, 0.80, 0.70, 0.60, 0.55, 0.50, 0.45]
    for i, a in enumerate(attainments):
        state, out = advance_silent(
            state,
            T0 + (21 + i) * MIN,
            collapsed(MIN, attainment=a),
            collapsed(5 * MIN, attainment=a),
            policy,
        )
        out_all += [(t.state, t.at_ms) for t in out]
    assert out_all == [("opened", T0 + 21 * MIN), ("updated", T0 + 26 * MIN)]


def test_an_evaluation_point_already_seen_changes_nothing() -> None:
    state = healthy(20)
    again, out = advance_silent(state, T0 + 20 * MIN, collapsed(MIN), collapsed(5 * MIN), POLICY)
    assert out == [] and again is state


def test_the_state_round_trips_through_bytes() -> None:
    state = healthy(12)
    state, _ = advance_silent(state, T0 + 13 * MIN, collapsed(MIN), collapsed(5 * MIN), POLICY)
    assert SilentState.from_bytes(state.to_bytes()) == state


def test_the_policy_refuses_nonsense() -> None:
    with pytest.raises(ConfigError):
        SilentPolicy(short_window_ms=90_000)
    with pytest.raises(ConfigError):
        SilentPolicy(p95_rise=0.9)


def test_a_minute_read_over_a_longer_window_keeps_its_counts_and_spreads_its_rate() -> None:
    minute = stats(MIN, stages={"prefill": 250.0})
    short = minute.over(POLICY.short_window_ms)
    assert short == msgspec.structs.replace(minute, window_ms=POLICY.short_window_ms)
    assert short.rate_rps == pytest.approx(minute.rate_rps * MIN / POLICY.short_window_ms)
