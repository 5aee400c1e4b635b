"""Burn rates, error budgets and the multi-window, multi-burn-rate policy (SRE workbook ch. 5)."""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tailguard.streams import WINDOWS, ConfigError, Counters, SeriesWindows, Thresholds
from tailguard.streams.burn import (
    DEFAULT_RULES,
    SLO_PERIOD_MS,
    BurnPolicy,
    BurnRule,
    Selector,
    SloSpec,
    applicable,
    bad_and_total,
    burn_rate,
    eligible_requests,
    evaluate,
    goodput_rps,
    thresholds_for,
    time_to_detect_ms,
    window_ms,
)
from tailguard.streams.burn_windows import fires, fires_each, window_counters

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DAY_MS = 86_400_000

MakeEvent = Callable[..., Any]
MakeWindows = Callable[..., SeriesWindows]

TTFT = SloSpec(name="ttft-p99", sli="ttft_ms", target=0.99, ttft_ms=800.0)
SUCCESS = SloSpec(name="success-rate", sli="success", target=0.992)
COMPOSITE = SloSpec(name="composite", sli="composite", target=0.99, ttft_ms=800.0, itl_ms=120.0)
ALL_WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")


def ttft_counters(bad: int, total: int) -> Counters:
    """Counters of ``total`` ok requests of which ``bad`` missed the TTFT threshold."""
    return Counters(requests=total, ttft_total=total, ttft_good=total - bad)


def windows_of(**by_name: Counters) -> dict[str, Counters]:
    """Counters for every default window: the named ones as given, the others healthy."""
    healthy = ttft_counters(0, 10_000)
    return {**{name: healthy for name in ALL_WINDOWS}, **by_name}


# ------------------------------------------------------------------ windows


@pytest.mark.parametrize(
    ("name", "ms"),
    [
        ("5m", 5 * MINUTE_MS),
        ("30m", 30 * MINUTE_MS),
        ("1h", HOUR_MS),
        ("2h", 2 * HOUR_MS),
        ("6h", 6 * HOUR_MS),
        ("1d", DAY_MS),
        ("3d", 3 * DAY_MS),
        ("30d", 30 * DAY_MS),
        ("1w", 7 * DAY_MS),
        ("90s", 90_000),
    ],
)
def test_window_names_are_a_count_and_a_unit(name: str, ms: int) -> None:
    assert window_ms(name) == ms


@pytest.mark.parametrize("name", ["", "0m", "5", "m", "1.5h", "1M", "-1h", "1 h", "05m"])
def test_window_names_that_are_not_count_and_unit_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="window"):
        window_ms(name)


# ------------------------------------------------------------------ SLI → counters


COUNTERS = Counters(
    requests=1_000,
    errors=8,
    cancelled=12,
    warmup=5,
    ttft_total=970,
    ttft_good=950,
    itl_total=19_000,
    itl_good=18_810,
    e2e_total=970,
    e2e_good=900,
    good_requests=930,
)


@pytest.mark.parametrize(
    ("spec", "bad", "total", "eligible"),
    [
        (TTFT, 20, 970, 970),
        (SloSpec(name="itl", sli="itl_ms", target=0.99, itl_ms=120.0), 190, 19_000, 980),
        (SloSpec(name="e2e", sli="e2e_ms", target=0.95, e2e_ms=800.0), 70, 970, 970),
        (SUCCESS, 8, 988, 988),
        (SloSpec(name="goodput", sli="goodput", target=0.9), 58, 988, 988),
    ],
    ids=["ttft", "itl-per-gap", "e2e", "success-without-cancelled", "goodput"],
)
def test_each_sli_reads_its_bad_and_total_counters(
    spec: SloSpec, bad: float, total: float, eligible: int
) -> None:
    assert bad_and_total(spec, COUNTERS) == (bad, total)
    assert eligible_requests(spec, COUNTERS) == eligible


def test_composite_bad_fraction_is_the_weighted_bad_fraction_per_request() -> None:
    # TTFT bad 20/970, ITL bad 190/19 000 = 0.01 → 0.7·20/970 + 0.3·0.01 of 970 requests.
    bad, total = bad_and_total(COMPOSITE, COUNTERS)
    assert total == 970
    assert bad / total == pytest.approx(0.7 * 20 / 970 + 0.3 * 0.01)
    assert eligible_requests(COMPOSITE, COUNTERS) == 970


def test_composite_without_itl_gaps_renormalises_to_ttft_compliance() -> None:
    bad, total = bad_and_total(COMPOSITE, ttft_counters(bad=30, total=1_000))
    assert (bad, total) == (pytest.approx(30), 1_000)


def test_composite_of_an_empty_window_has_no_events() -> None:
    assert bad_and_total(COMPOSITE, Counters()) == (0.0, 0)


@pytest.mark.parametrize(
    ("bad", "total", "target", "rate"),
    [
        (1, 100, 0.99, 1.0),
        (144, 1_000, 0.99, 14.4),
        (60, 1_000, 0.99, 6.0),
        (8, 1_000, 0.992, 1.0),
        (50, 1_000, 0.95, 1.0),
        (1, 1_000, 0.999, 1.0),
        (1_000, 1_000, 0.99, 100.0),
        (0, 1_000, 0.99, 0.0),
        (0, 0, 0.99, 0.0),
    ],
)
def test_burn_rate_is_bad_fraction_over_error_budget(
    bad: int, total: int, target: float, rate: float
) -> None:
    assert burn_rate(bad, total, target) == pytest.approx(rate)


def test_goodput_is_good_requests_per_second_of_the_window() -> None:
    assert goodput_rps(COUNTERS, 5 * MINUTE_MS) == pytest.approx(930 / 300)
    with pytest.raises(ConfigError, match="goodput window"):
        goodput_rps(COUNTERS, 0)


# ------------------------------------------------------------------ the workbook


@pytest.mark.parametrize(
    ("rule", "consumed"),
    [
        (BurnRule("page", 14.4, "1h", "5m"), 0.02),
        (BurnRule("page", 6.0, "6h", "30m"), 0.05),
        (BurnRule("ticket", 3.0, "1d", "2h"), 0.10),
        (BurnRule("ticket", 1.0, "3d", "6h"), 0.10),
    ],
)
def test_default_rules_are_the_workbook_table_for_a_30_day_budget(
    rule: BurnRule, consumed: float
) -> None:
    """Workbook table: page 2 % in 1 h, page 5 % in 6 h, ticket 10 % in 1 d and in 3 d."""
    assert rule in DEFAULT_RULES
    assert rule.budget_consumed(SLO_PERIOD_MS) == pytest.approx(consumed)


@pytest.mark.parametrize(
    ("bad_fraction", "target", "long_ms", "rate", "detect_ms"),
    [
        # workbook: 99.9 % SLO, 100 % errors, 14.4× over 1 h → 0.001 · 60 min · 14.4 = 51.84 s
        (1.0, 0.999, HOUR_MS, 14.4, 51_840),
        # tailguard's 99 % TTFT SLO: 0.01 · 60 min · 14.4 = 8.64 min
        (1.0, 0.99, HOUR_MS, 14.4, 518_400),
        # half the requests bad: twice as long
        (0.5, 0.99, HOUR_MS, 14.4, 1_036_800),
        # 6× over 6 h: 0.01 · 360 min · 6 = 21.6 min
        (1.0, 0.99, 6 * HOUR_MS, 6.0, 1_296_000),
        # a bad fraction below rate · budget never fires
        (0.1, 0.99, HOUR_MS, 14.4, math.inf),
    ],
)
def test_time_to_detect_follows_the_workbook_formula(
    bad_fraction: float, target: float, long_ms: int, rate: float, detect_ms: float
) -> None:
    assert time_to_detect_ms(bad_fraction, target, long_ms, rate) == pytest.approx(detect_ms)


# ------------------------------------------------------------------ evaluate


def test_a_rule_fires_only_when_both_of_its_windows_exceed_its_rate() -> None:
    both = evaluate(
        TTFT,
        BurnPolicy(),
        windows_of(**{"1h": ttft_counters(150, 1_000), "5m": ttft_counters(20, 100)}),
    )
    assert both.severity == "page"
    assert [f.rule for f in both.firing] == [DEFAULT_RULES[0]]
    assert both.burn_rates["1h"] == pytest.approx(15.0)
    assert both.burn_rates["5m"] == pytest.approx(20.0)

    long_only = evaluate(TTFT, BurnPolicy(), windows_of(**{"1h": ttft_counters(150, 1_000)}))
    assert long_only.severity is None and long_only.firing == ()

    short_only = evaluate(TTFT, BurnPolicy(), windows_of(**{"5m": ttft_counters(100, 100)}))
    assert short_only.severity is None


@pytest.mark.parametrize(
    ("bad_1h", "fires"),
    [(143, False), (144, False), (145, True)],
    ids=["below", "exactly-14.4x-does-not-exceed", "above"],
)
def test_a_burn_rate_must_exceed_the_rule_rate_not_equal_it(bad_1h: int, fires: bool) -> None:
    verdict = evaluate(
        TTFT,
        BurnPolicy(),
        windows_of(**{"1h": ttft_counters(bad_1h, 1_000), "5m": ttft_counters(50, 100)}),
    )
    assert (verdict.severity == "page") is fires


def test_severity_is_the_highest_of_the_firing_rules() -> None:
    bad = ttft_counters(200, 1_000)  # 20× everywhere: every rule fires
    verdict = evaluate(TTFT, BurnPolicy(), {name: bad for name in ALL_WINDOWS})
    assert verdict.severity == "page"
    assert {f.rule for f in verdict.firing} == set(DEFAULT_RULES)


def test_ticket_rules_alone_give_a_ticket() -> None:
    slow = ttft_counters(40, 1_000)  # 4×: above 3× and 1×, below 6× and 14.4×
    verdict = evaluate(TTFT, BurnPolicy(), {name: slow for name in ALL_WINDOWS})
    assert verdict.severity == "ticket"
    assert {f.rule.name for f in verdict.firing} == {"ticket 3x 1d/2h", "ticket 1x 3d/6h"}


def test_sli_values_are_good_fractions_per_window_and_empty_windows_have_none() -> None:
    counters = windows_of(**{"1h": ttft_counters(15, 1_000), "5m": Counters()})
    verdict = evaluate(TTFT, BurnPolicy(), counters)
    assert verdict.sli["1h"] == pytest.approx(0.985)
    assert "5m" not in verdict.sli
    assert verdict.burn_rates["5m"] == 0.0
    assert verdict.events["1h"] == 1_000


def test_missing_window_counters_are_named() -> None:
    counters = windows_of()
    del counters["2h"]
    with pytest.raises(ConfigError, match=r"\['2h'\]"):
        evaluate(TTFT, BurnPolicy(), counters)


# ------------------------------------------------------------------ traffic gate


def test_a_burning_rule_on_too_little_traffic_is_gated_not_fired() -> None:
    """Six requests an hour, one failed: 1/6 = 17 % bad is 21× a 99.2 % budget, yet no page."""
    quiet = {name: Counters(requests=6, errors=0) for name in ALL_WINDOWS}
    quiet["1h"] = Counters(requests=6, errors=1)
    quiet["5m"] = Counters(requests=1, errors=1)
    verdict = evaluate(SUCCESS, BurnPolicy(), quiet)
    assert verdict.severity is None
    assert [f.rule for f in verdict.gated] == [DEFAULT_RULES[0]]
    assert verdict.burn_rates["1h"] == pytest.approx(1 / 6 / 0.008)

    ungated = evaluate(SUCCESS, BurnPolicy(min_long_events=0, min_short_events=0), quiet)
    assert ungated.severity == "page"


@pytest.mark.parametrize(
    ("long_requests", "short_requests", "fires"),
    [(99, 50, False), (100, 9, False), (100, 10, True)],
)
def test_the_gate_needs_min_long_events_and_min_short_events(
    long_requests: int, short_requests: int, fires: bool
) -> None:
    counters = windows_of(
        **{
            "1h": ttft_counters(long_requests // 2, long_requests),
            "5m": ttft_counters(short_requests, short_requests),
        }
    )
    verdict = evaluate(TTFT, BurnPolicy(), counters)
    assert (verdict.severity == "page") is fires
    assert bool(verdict.gated) is not fires


def test_one_failure_on_a_quiet_series_never_pages(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    """A request every 10 minutes for 3 hours, then one error: gated, never a page or ticket."""
    series = make_windows()
    for i in range(18):
        series.add([make_event(t0 + i * 10 * MINUTE_MS)])
    failed_at = t0 + 3 * HOUR_MS
    series.add([make_event(failed_at, status="error")])
    policy = BurnPolicy()
    verdict = evaluate(SUCCESS, policy, window_counters(series, policy, failed_at + MINUTE_MS))
    assert verdict.burn_rates["1h"] > 14.4 and verdict.burn_rates["5m"] > 14.4
    assert verdict.severity is None
    assert DEFAULT_RULES[0] in {f.rule for f in verdict.gated}


# ------------------------------------------------------------------ detection time


def test_full_outage_after_a_healthy_period_pages_9_minutes_after_onset(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    """THE detection time: 14.4× over (1 h, 5 m) against a 99 % TTFT objective.

    Steady traffic of 60 requests a minute (one a second), healthy (TTFT
    200 ms) for 3 hours, then every request over the 800 ms threshold from
    ``onset``. Evaluated at the end of each closed minute bucket, ``k`` minutes
    after onset the 1 h window holds ``60·k`` bad of 3 600: a burn rate of
    ``(k/60)/0.01 = 1.667·k``, which exceeds 14.4 once ``k > 8.64`` — the
    workbook's ``0.01 · 60 min · 14.4 = 8.64 min`` — so the first page is at
    the end of the 9th minute bucket after onset (the 5 m window has been
    full of bad requests, 100×, since minute 5). The verdict is computed
    when that bucket closes, i.e. 2 minutes of allowed lateness later in
    event time.

    The slower rules come earlier only because the history is 3 hours long:
    the 3 d / 6 h windows hold the same 3 h, so 1× (1 % bad) is crossed at
    ``k = 2`` (120/10 920 bad) and severity is ``ticket`` from minute 2 to 8.
    """
    policy = BurnPolicy()
    series = make_windows()
    onset = t0 + 3 * HOUR_MS
    severity_at: dict[int, str | None] = {}
    rate_1h_at: dict[int, float] = {}
    for minute in range(3 * 60 + 15):
        start = t0 + minute * MINUTE_MS
        ttft = 200.0 if start < onset else 2_000.0
        batch = [make_event(start + s * 1_000, ttft_ms=ttft, e2e_ms=3_000.0) for s in range(60)]
        result = series.add(batch)
        for end in result.closed_ends:
            verdict = evaluate(TTFT, policy, window_counters(series, policy, end))
            k = (end - onset) // MINUTE_MS
            severity_at[k] = verdict.severity
            rate_1h_at[k] = verdict.burn_rates["1h"]
    first_page = min(k for k, sev in severity_at.items() if sev == "page")
    assert first_page == 9
    assert math.ceil(time_to_detect_ms(1.0, 0.99, HOUR_MS, 14.4) / MINUTE_MS) == first_page
    assert rate_1h_at[8] == pytest.approx(8 / 60 / 0.01)  # 13.3×: not yet
    assert rate_1h_at[9] == pytest.approx(15.0)
    assert [severity_at[k] for k in range(-2, 10)] == [None] * 4 + ["ticket"] * 7 + ["page"]


# ------------------------------------------------------------------ budget


def test_budget_remaining_is_projected_from_the_longest_window_within_the_period() -> None:
    counters = windows_of(**{"3d": ttft_counters(25, 10_000)})  # 0.25 % bad: a quarter of 1 %
    verdict = evaluate(TTFT, BurnPolicy(), counters)
    assert verdict.budget_window == "3d"
    assert verdict.budget_remaining == pytest.approx(0.75)


def test_a_30_day_window_when_given_is_the_budget_window_and_overspending_goes_negative() -> None:
    counters = windows_of(**{"30d": ttft_counters(300, 10_000)})
    verdict = evaluate(TTFT, BurnPolicy(), counters)
    assert verdict.budget_window == "30d"
    assert verdict.budget_remaining == pytest.approx(1 - 3.0)


def test_an_slo_of_another_period_scales_the_rule_rates() -> None:
    """A 7-day SLO pages when 2 % of *its* budget goes in an hour: 14.4 · 7/30 = 3.36×."""
    weekly = SloSpec(name="w", sli="ttft_ms", target=0.99, ttft_ms=800.0, window_ms=7 * DAY_MS)
    counters = windows_of(**{"1h": ttft_counters(40, 1_000), "5m": ttft_counters(40, 1_000)})
    verdict = evaluate(weekly, BurnPolicy(), counters)
    assert verdict.severity == "page"
    assert verdict.firing[0].threshold == pytest.approx(3.36)
    assert evaluate(TTFT, BurnPolicy(), counters).severity is None
    assert verdict.budget_window == "3d"


# ------------------------------------------------------------------ properties


counts = st.integers(min_value=0, max_value=100_000)
targets = st.sampled_from([0.9, 0.95, 0.99, 0.992, 0.999])


@given(bad=counts, extra=counts, more_bad=st.integers(1, 1_000), target=targets)
def test_more_bad_events_never_lower_the_burn_rate(
    bad: int, extra: int, more_bad: int, target: float
) -> None:
    total = bad + extra + more_bad
    assert burn_rate(bad + more_bad, total, target) > burn_rate(bad, total, target)


window_counts = st.builds(
    lambda total, bad_share: ttft_counters(int(total * bad_share), total),
    st.integers(0, 5_000),
    st.floats(0, 1),
)


@given(by_window=st.fixed_dictionaries({name: window_counts for name in ALL_WINDOWS}))
def test_a_verdict_is_consistent_with_its_rates_gate_and_budget(
    by_window: dict[str, Counters],
) -> None:
    policy = BurnPolicy()
    verdict = evaluate(TTFT, policy, by_window)
    for hit in verdict.firing:
        assert hit.long_rate > hit.threshold and hit.short_rate > hit.threshold
        assert verdict.events[hit.rule.long] >= policy.min_long_events
        assert verdict.events[hit.rule.short] >= policy.min_short_events
    if verdict.firing:
        assert verdict.severity == max(
            (f.rule.severity for f in verdict.firing), key=("ticket", "page").index
        )
    else:
        assert verdict.severity is None
    assert verdict.budget_remaining == pytest.approx(1 - verdict.burn_rates["3d"])


# ------------------------------------------------------------------ config


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sli": "tpot_ms"}, "unknown SLI"),
        ({"target": 1.0}, "no error budget"),
        ({"target": 0.0}, "target"),
        ({"target": math.nan}, "target"),
        ({"ttft_ms": None}, "needs its threshold"),
        ({"ttft_ms": -1.0}, "threshold ttft_ms"),
        ({"ttft_weight": 0.5}, "sum to 1"),
        ({"window_ms": 0}, "window_ms"),
        ({"op": "gt"}, "op"),
        ({"name": ""}, "name"),
    ],
)
def test_an_impossible_slo_is_refused_with_the_reason(fields: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"name": "x", "sli": "ttft_ms", "target": 0.99, "ttft_ms": 800.0}
    with pytest.raises(ConfigError, match=message):
        SloSpec(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"severity": "sms"}, "severity"),
        ({"rate": 0.0}, "rate"),
        ({"long": "5m", "short": "1h"}, "shorter"),
        ({"long": "1x"}, "window"),
    ],
)
def test_an_impossible_rule_is_refused(fields: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"severity": "page", "rate": 14.4, "long": "1h", "short": "5m"}
    with pytest.raises(ConfigError, match=message):
        BurnRule(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rules": ()}, "at least one rule"),
        ({"min_long_events": -1}, "min_long_events"),
        ({"period_ms": 0}, "period_ms"),
        ({"budget_window": "3days"}, "window"),
    ],
)
def test_an_impossible_policy_is_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BurnPolicy(**fields)


def test_policy_windows_are_every_rule_window_and_the_budget_window_shortest_first() -> None:
    assert list(BurnPolicy().windows) == ["5m", "30m", "1h", "2h", "6h", "1d", "3d"]


# ------------------------------------------------------------------ selection and thresholds


@pytest.mark.parametrize(
    ("selector", "series", "matches"),
    [
        (Selector(), ("chat", "llama", "a", "acme"), True),
        (Selector(service=("chat",)), ("chat", "llama", "default", "default"), True),
        (Selector(service=("chat",)), ("search", "llama", "default", "default"), False),
        (Selector(model=("llama-*",)), ("chat", "llama-3-8b", "default", "default"), True),
        (Selector(model=("llama-*",)), ("chat", "mistral", "default", "default"), False),
        (Selector(tenant=("acme", "globex")), ("chat", "m", "default", "globex"), True),
        (Selector(variant=("b",)), ("chat", "m", "a", "default"), False),
    ],
)
def test_selectors_match_series_labels_by_glob(
    selector: Selector, series: tuple[str, str, str, str], matches: bool
) -> None:
    assert selector.matches(*series) is matches


def test_applicable_keeps_the_slos_whose_selector_matches_in_order() -> None:
    chat = SloSpec(name="chat", sli="success", target=0.99, selector=Selector(service=("chat",)))
    assert applicable([TTFT, chat, SUCCESS], "search", "m") == (TTFT, SUCCESS)
    assert applicable([TTFT, chat, SUCCESS], "chat", "m") == (TTFT, chat, SUCCESS)


def test_thresholds_for_merge_the_slos_thresholds_over_the_base() -> None:
    e2e = SloSpec(name="e2e", sli="e2e_ms", target=0.95, e2e_ms=800.0)
    assert thresholds_for([TTFT, COMPOSITE, SUCCESS, e2e]) == Thresholds(e2e_ms=800.0)
    assert thresholds_for([]) == Thresholds()


def test_thresholds_for_refuse_two_slos_that_disagree_and_name_both() -> None:
    guardrail = SloSpec(name="ttft-p95", sli="ttft_ms", target=0.95, ttft_ms=300.0)
    with pytest.raises(ConfigError, match=r"'ttft-p99' and 'ttft-p95'.*ttft_ms 800 and 300"):
        thresholds_for([TTFT, guardrail])


window_counts = st.builds(
    lambda total, bad, errors, cancelled: Counters(
        requests=total + errors + cancelled,
        errors=errors,
        cancelled=cancelled,
        ttft_total=total,
        ttft_good=total - min(bad, total),
        itl_total=2 * total,
        itl_good=2 * total - min(bad, total),
        good_requests=total - min(bad, total),
    ),
    st.integers(0, 2_000),
    st.integers(0, 2_000),
    st.integers(0, 50),
    st.integers(0, 50),
)


@given(
    counters=st.fixed_dictionaries({name: window_counts for name in ALL_WINDOWS}),
    spec=st.sampled_from([TTFT, SUCCESS, COMPOSITE]),
)
def test_fires_says_whether_the_evaluation_has_a_severity(
    counters: dict[str, Counters], spec: SloSpec
) -> None:
    # The close skips building a verdict when nothing fires: the two must agree.
    policy = BurnPolicy()
    assert fires(spec, policy, counters) == (evaluate(spec, policy, counters).severity is not None)


@given(
    shared=window_counts,
    spec=st.sampled_from([TTFT, SUCCESS, COMPOSITE]),
    same=st.lists(st.sampled_from(ALL_WINDOWS), unique=True),
)
def test_windows_sharing_one_counters_object_fire_as_copies_would(
    shared: Counters, spec: SloSpec, same: list[str]
) -> None:
    # A young series' windows hold the same buckets: the ring hands every one of
    # them the same Counters object, which fires reads once.
    policy = BurnPolicy()
    one = {name: shared if name in same else Counters() for name in ALL_WINDOWS}
    copies = {name: dataclasses.replace(c) for name, c in one.items()}
    assert fires(spec, policy, one) == fires(spec, policy, copies)
    assert fires(spec, policy, one) == (evaluate(spec, policy, copies).severity is not None)


ITL = SloSpec(name="itl-p99", sli="itl_ms", target=0.99, itl_ms=120.0)
COMPOSITE_TTFT_HEAVY = SloSpec(
    name="composite-ttft",
    sli="composite",
    target=0.995,
    ttft_ms=800.0,
    itl_ms=120.0,
    ttft_weight=0.9,
    itl_weight=0.1,
)


@given(
    shared=st.lists(window_counts, min_size=1, max_size=3),
    which=st.fixed_dictionaries({name: st.integers(0, 2) for name in ALL_WINDOWS}),
    specs=st.lists(
        st.sampled_from([TTFT, SUCCESS, COMPOSITE, ITL, COMPOSITE_TTFT_HEAVY]),
        min_size=1,
        max_size=5,
    ),
)
def test_fires_each_says_for_every_slo_whether_its_evaluation_has_a_severity(
    shared: list[Counters], which: dict[str, int], specs: list[SloSpec]
) -> None:
    # The SLOs of a series are screened together; windows share counters objects
    # (as a young series' do), and two composites with other weights share none
    # of their tallies.
    policy = BurnPolicy()
    windows = {name: shared[i % len(shared)] for name, i in which.items()}
    copies = {name: dataclasses.replace(c) for name, c in windows.items()}
    expected = [evaluate(spec, policy, copies).severity is not None for spec in specs]
    assert fires_each(specs, policy, windows) == expected


def test_fires_each_reads_a_long_window_only_when_its_short_window_burns() -> None:
    read: list[str] = []

    class Recording(dict[str, Counters]):
        def __getitem__(self, name: str) -> Counters:
            read.append(name)
            return super().__getitem__(name)

    quiet = Recording(windows_of())
    assert fires_each([TTFT, SUCCESS], BurnPolicy(), quiet) == [False, False]
    assert sorted(set(read)) == sorted({rule.short for rule in DEFAULT_RULES})
    read.clear()
    burning = Recording(
        windows_of(**{"1h": ttft_counters(150, 1_000), "5m": ttft_counters(20, 100)})
    )
    assert fires_each([SUCCESS, TTFT], BurnPolicy(), burning) == [False, True]
    assert "1h" in read and read.count("5m") == 1, "each window is looked up once"


def test_fires_on_a_paging_burn_and_not_on_a_gated_one() -> None:
    burning = windows_of(**{"1h": ttft_counters(150, 1_000), "5m": ttft_counters(20, 100)})
    assert fires(TTFT, BurnPolicy(), burning)
    few = windows_of(**{"1h": ttft_counters(15, 99), "5m": ttft_counters(5, 9)})
    assert evaluate(TTFT, BurnPolicy(), few).gated and not fires(TTFT, BurnPolicy(), few)


class _CountingRing:
    """A ring that records which windows were summed."""

    def __init__(self, series: SeriesWindows) -> None:
        self.series = series
        self.summed: list[int] = []

    def counters(self, window: int, end: int | None = None) -> Counters:
        self.summed.append(window)
        return self.series.counters(window, end)

    def counters_many(self, windows: list[int], end: int) -> list[Counters]:
        self.summed += windows
        return self.series.counters_many(windows, end)

    @property
    def coarse(self) -> dict[int, Any]:
        return self.series.coarse


def test_window_counters_sum_a_window_once_and_only_when_read(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    series = make_windows()
    for i in range(30):
        series.add([make_event(t0 + i * MINUTE_MS, status="error" if i % 3 else "ok")])
    policy, end = BurnPolicy(), t0 + 30 * MINUTE_MS
    ring = _CountingRing(series)
    lazy = window_counters(ring, policy, end)  # type: ignore[arg-type]
    assert ring.summed == []
    assert set(lazy) == set(policy.windows) and len(lazy) == len(policy.windows)
    assert lazy["5m"] == series.counters(WINDOWS["5m"], end)
    assert lazy["5m"] is lazy["5m"] and ring.summed == [WINDOWS["5m"]]
    eager = {name: series.counters(ms, end) for name, ms in policy.windows.items()}
    assert evaluate(SUCCESS, policy, lazy) == evaluate(SUCCESS, policy, eager)
    assert sorted(ring.summed) == sorted(policy.windows.values())  # each once
    with pytest.raises(KeyError):
        lazy["7m"]


def test_a_series_with_hours_has_its_short_windows_summed_at_once(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    series = make_windows()
    for i in range(400):
        series.add([make_event(t0 + i * MINUTE_MS, status="error" if i % 7 == 0 else "ok")])
    policy, end = BurnPolicy(), t0 + 400 * MINUTE_MS
    assert series.coarse, "hours rolled up"
    ring = _CountingRing(series)
    counters = window_counters(ring, policy, end)  # type: ignore[arg-type]
    shorts = sorted(window_ms(rule.short) for rule in policy.rules)
    assert sorted(ring.summed) == shorts
    for name, ms in policy.windows.items():
        assert counters[name].as_list() == series.counters(ms, end).as_list(), name
    assert sorted(ring.summed) == sorted(policy.windows.values())  # each once


def test_a_quiet_series_is_judged_from_its_short_windows_alone(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    series = make_windows()
    for i in range(30):
        series.add([make_event(t0 + i * MINUTE_MS)])
    policy = BurnPolicy()
    ring = _CountingRing(series)
    assert not fires(SUCCESS, policy, window_counters(ring, policy, t0 + 30 * MINUTE_MS))  # type: ignore[arg-type]
    shorts = {window_ms(rule.short) for rule in policy.rules}
    assert set(ring.summed) == shorts


def test_equal_slos_and_policies_hash_alike_and_a_changed_one_does_not() -> None:
    import dataclasses

    from tailguard.streams.burn import BurnPolicy
    from tailguard.streams.slo import SloSpec

    a = SloSpec(name="ttft", sli="ttft_ms", target=0.99, ttft_ms=500.0)
    same = SloSpec(name="ttft", sli="ttft_ms", target=0.99, ttft_ms=500.0, source="slos.yaml:3")
    assert a == same and hash(a) == hash(same)  # where it came from is not compared
    tighter = dataclasses.replace(a, target=0.999)
    assert tighter != a and hash(tighter) != hash(a)
    assert hash(BurnPolicy()) == hash(BurnPolicy())
    assert hash(BurnPolicy(min_long_events=5)) != hash(BurnPolicy())
