"""Breach lifecycle: one opened, material updates only, one resolved after the hold, replayable."""

from collections.abc import Sequence
from dataclasses import replace
from itertools import pairwise

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tailguard.streams import ConfigError, CorruptStateError
from tailguard.streams.breach import (
    BreachPolicy,
    BreachState,
    Transition,
    advance,
    breach_id,
    replay,
)
from tailguard.streams.burn import Severity, Verdict

MINUTE_MS = 60_000
T0 = 1_699_995_600_000
SERIES = "chat/llama-3-8b/default/default"
SLO = "ttft-p99"
POLICY = BreachPolicy()  # hold 5 min, updates ≥ 5 min apart, material = 25 %


def verdict(
    severity: Severity | None, rate_1h: float = 0.0, rate_5m: float | None = None
) -> Verdict:
    """A verdict of ``SLO`` with the given severity and 1 h / 5 m burn rates."""
    return Verdict(
        slo=SLO,
        severity=severity,
        burn_rates={"5m": rate_1h if rate_5m is None else rate_5m, "1h": rate_1h},
        sli={"1h": 1 - rate_1h / 100},
        budget_remaining=0.5,
    )


def at(minute: int) -> int:
    return T0 + minute * MINUTE_MS


def run(
    steps: Sequence[Verdict], policy: BreachPolicy = POLICY, state: BreachState | None = None
) -> tuple[BreachState, list[Transition]]:
    """Feed one verdict per minute, minute 0 first."""
    start = state or BreachState(SERIES, SLO)
    return replay(start, [(at(i), v) for i, v in enumerate(steps)], policy)


def kinds(transitions: Sequence[Transition]) -> list[tuple[str, int]]:
    return [(t.state, (t.at_ms - T0) // MINUTE_MS) for t in transitions]


PAGE = verdict("page", 20.0)
QUIET = verdict(None, 0.5)


# ------------------------------------------------------------------ opened / resolved


def test_a_breach_opens_once_and_resolves_once_after_the_hold() -> None:
    _, out = run([QUIET, PAGE, PAGE, PAGE, QUIET, QUIET, QUIET, QUIET, QUIET, QUIET, QUIET])
    # last firing at minute 3; resolved at the first point ≥ 3 + 5 minutes
    assert kinds(out) == [("opened", 1), ("resolved", 8)]
    opened, resolved = out
    assert opened.breach_id == resolved.breach_id == breach_id(SERIES, SLO, at(1))
    assert (opened.seq, resolved.seq) == (0, 1)
    assert opened.opened_ms == resolved.opened_ms == at(1)
    assert (opened.resolved_ms, resolved.resolved_ms) == (None, at(8))
    assert opened.severity == resolved.severity == "page"
    assert opened.rules == () and resolved.rules == ()  # hand-made verdicts carry no Firing
    assert resolved.event_id == f"{resolved.breach_id}:1"


def test_a_rule_firing_again_within_the_hold_keeps_the_breach_open() -> None:
    steps = [PAGE, QUIET, QUIET, QUIET, QUIET, PAGE, QUIET, QUIET, QUIET, QUIET, QUIET]
    _, out = run(steps)
    assert kinds(out) == [("opened", 0), ("resolved", 10)]


def test_a_new_breach_after_resolution_gets_a_new_id() -> None:
    _, out = run([PAGE] + [QUIET] * 5 + [PAGE] + [QUIET] * 5)
    assert kinds(out) == [("opened", 0), ("resolved", 5), ("opened", 6), ("resolved", 11)]
    assert out[0].breach_id != out[2].breach_id
    assert out[2].breach_id == breach_id(SERIES, SLO, at(6))


def test_gated_or_quiet_verdicts_never_open_a_breach() -> None:
    state, out = run([QUIET] * 10)
    assert out == [] and not state.is_open and state.last_at_ms == at(9)


# ------------------------------------------------------------------ updated


def test_small_rate_changes_are_not_news_and_material_ones_wait_for_the_interval() -> None:
    steps = [
        verdict("page", 16.0),  # 0 opened
        verdict("page", 19.0),  # 1 +19 %: not material
        verdict("page", 24.0),  # 2 +50 %: material, but only 2 min since the last transition
        verdict("page", 24.0),  # 3
        verdict("page", 24.0),  # 4
        verdict("page", 24.0),  # 5 material and 5 min since opened: updated
        verdict("page", 26.0),  # 6 +8 % of the emitted 24: not material
        verdict("page", 26.0),  # 7
        verdict("page", 26.0),  # 8
        verdict("page", 26.0),  # 9
        verdict("page", 26.0),  # 10 5 min since, but 26 vs 24 is not material
        verdict("page", 12.0),  # 11 −50 %: updated
    ]
    _, out = run(steps)
    assert kinds(out) == [("opened", 0), ("updated", 5), ("updated", 11)]
    assert [t.reason for t in out[1:]] == ["burn_rate", "burn_rate"]
    assert out[1].burn_rates["1h"] == 24.0 and out[2].burn_rates["1h"] == 12.0
    assert [t.seq for t in out] == [0, 1, 2]


def test_escalation_to_page_is_immediate_and_deescalation_waits_the_hold() -> None:
    ticket = verdict("ticket", 4.0)
    steps = [ticket, verdict("page", 16.0), ticket, ticket, ticket, ticket, ticket, ticket]
    _, out = run(steps)
    # page last fired at minute 1: severity drops back to ticket at 1 + 5
    assert kinds(out) == [("opened", 0), ("updated", 1), ("updated", 6)]
    assert [(t.severity, t.reason) for t in out] == [
        ("ticket", None),
        ("page", "severity"),
        ("ticket", "severity"),
    ]


def test_peak_burn_rates_are_the_highest_seen_during_the_breach() -> None:
    steps = [verdict("page", 16.0, 40.0), verdict("page", 30.0, 20.0)] + [QUIET] * 6
    _, out = run(steps)
    resolved = out[-1]
    assert resolved.state == "resolved"
    assert resolved.peak_burn_rates == {"1h": 30.0, "5m": 40.0}


def test_rates_falling_while_nothing_fires_do_not_update() -> None:
    steps = [verdict("page", 40.0)] + [verdict(None, 40.0 - 8 * i) for i in range(1, 5)]
    _, out = run(steps, BreachPolicy(update_interval_ms=0))
    assert kinds(out) == [("opened", 0)]


# ------------------------------------------------------------------ event time


def test_an_evaluation_point_not_after_the_last_one_is_ignored() -> None:
    state, _ = run([PAGE, PAGE])
    again, more = advance(state, at(1), QUIET)
    earlier, even_more = advance(state, at(0), verdict("page", 90.0))
    assert (again, more) == (state, ())
    assert (earlier, even_more) == (state, ())


def test_a_verdict_of_another_slo_is_refused() -> None:
    other = Verdict(slo="itl-p99", severity=None)
    with pytest.raises(ConfigError, match="itl-p99"):
        advance(BreachState(SERIES, SLO), at(0), other)


def test_breach_ids_depend_on_series_slo_and_opening_time_only() -> None:
    ids = {
        breach_id(SERIES, SLO, at(0)),
        breach_id(SERIES, SLO, at(1)),
        breach_id(SERIES, "itl-p99", at(0)),
        breach_id("search/m/default/default", SLO, at(0)),
    }
    assert len(ids) == 4
    assert breach_id(SERIES, SLO, at(0)) == breach_id(SERIES, SLO, at(0))
    assert len(breach_id(SERIES, SLO, at(0))) == 32


# ------------------------------------------------------------------ storage


def test_state_serialises_to_bytes_and_restores_equal() -> None:
    state, _ = run([PAGE, verdict("page", 30.0, 12.5)])
    assert state.is_open
    assert BreachState.from_bytes(state.to_bytes()) == state
    idle = BreachState(SERIES, SLO)
    assert BreachState.from_bytes(idle.to_bytes()) == idle


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\x01garbage",
        msgspec.msgpack.encode(
            [99, SERIES, SLO, None, None, None, None, None, None, None, {}, {}, 0]
        ),
        msgspec.msgpack.encode(
            [1, SERIES, SLO, None, None, None, "sms", None, None, None, {}, {}, 0]
        ),
    ],
    ids=["empty", "garbage", "future-version", "unknown-severity"],
)
def test_corrupt_state_bytes_raise_with_the_key(data: bytes) -> None:
    with pytest.raises(CorruptStateError, match="'k1'"):
        BreachState.from_bytes(data, key="k1")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"resolve_hold_ms": -1}, "resolve_hold_ms"),
        ({"update_interval_ms": 1.5}, "update_interval_ms"),
        ({"material_change": 0.0}, "material_change"),
        ({"rate_floor": 0.0}, "rate_floor"),
    ],
)
def test_an_impossible_breach_policy_is_refused(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BreachPolicy(**fields)  # type: ignore[arg-type]


# ------------------------------------------------------------------ properties

severities = st.sampled_from([None, None, "ticket", "page"])
rates = st.floats(min_value=0, max_value=200, allow_nan=False)
steps_strategy = st.lists(
    st.tuples(st.integers(1, 4), severities, rates, rates),
    max_size=60,
)


def to_points(steps: list[tuple[int, str | None, float, float]]) -> list[tuple[int, Verdict]]:
    points: list[tuple[int, Verdict]] = []
    now = T0
    for gap, severity, rate_1h, rate_5m in steps:
        now += gap * MINUTE_MS
        points.append((now, verdict(severity, rate_1h, rate_5m)))  # type: ignore[arg-type]
    return points


@given(steps=steps_strategy)
def test_each_breach_is_opened_then_updated_then_resolved_and_breaches_never_overlap(
    steps: list[tuple[int, str | None, float, float]],
) -> None:
    _, out = replay(BreachState(SERIES, SLO), to_points(steps), POLICY)
    open_id: str | None = None
    for t in out:
        if t.state == "opened":
            assert open_id is None and t.seq == 0
            open_id = t.breach_id
            expected_seq = 1
        else:
            assert t.breach_id == open_id and t.seq == expected_seq
            expected_seq += 1
            if t.state == "resolved":
                open_id = None
    assert len({t.breach_id for t in out if t.state == "opened"}) == sum(
        t.state == "opened" for t in out
    )


@given(steps=steps_strategy)
def test_resolution_follows_a_full_hold_without_any_firing_rule(
    steps: list[tuple[int, str | None, float, float]],
) -> None:
    points = to_points(steps)
    _, out = replay(BreachState(SERIES, SLO), points, POLICY)
    for t in out:
        if t.state != "resolved":
            continue
        fired_before = [ms for ms, v in points if v.severity is not None and ms < t.at_ms]
        assert t.at_ms - max(fired_before) >= POLICY.resolve_hold_ms


@given(steps=steps_strategy)
def test_rate_updates_are_at_least_the_interval_apart(
    steps: list[tuple[int, str | None, float, float]],
) -> None:
    _, out = replay(BreachState(SERIES, SLO), to_points(steps), POLICY)
    for before, after in pairwise(out):
        if after.reason == "burn_rate" and before.breach_id == after.breach_id:
            assert after.at_ms - before.at_ms >= POLICY.update_interval_ms


@given(steps=steps_strategy, cut=st.integers(0, 60))
def test_replay_is_deterministic_and_a_restore_midway_changes_nothing(
    steps: list[tuple[int, str | None, float, float]], cut: int
) -> None:
    points = to_points(steps)
    start = BreachState(SERIES, SLO)
    final, whole = replay(start, points, POLICY)
    assert replay(start, points, POLICY) == (final, whole)

    middle, first = replay(start, points[:cut], POLICY)
    restored = BreachState.from_bytes(middle.to_bytes())
    assert restored == middle
    # re-delivering what came before the cut is a no-op, then the rest continues
    end, second = replay(restored, points[: cut // 2] + points[cut:], POLICY)
    assert (end, first + second) == (final, whole)


@given(steps=steps_strategy, rate=rates)
def test_a_quiet_verdict_without_an_open_breach_moves_only_the_time(
    steps: list[tuple[int, str | None, float, float]], rate: float
) -> None:
    # The breach engine relies on this to skip such evaluations: nothing to
    # publish and nothing to store (it stores only transitions and open states).
    points = to_points(steps)
    state, _ = replay(BreachState(SERIES, SLO), points, POLICY)
    if state.is_open:
        return
    later = (points[-1][0] if points else T0) + MINUTE_MS
    new, transitions = advance(state, later, verdict(None, rate), POLICY)
    assert transitions == ()
    assert new == replace(state, last_at_ms=later)
    assert not new.is_open
