"""Error budgets and multi-window, multi-burn-rate alerting (Google SRE workbook, ch. 5).

An SLO says "``target`` of the eligible events are good over a rolling period
``P``" (30 days by default). Its *error budget* is the bad fraction it may
spend, ``1 − target``. Over any window ``W``::

    bad fraction  f(W) = bad(W) / total(W)
    burn rate     r(W) = f(W) / (1 − target)          1.0 = spending exactly on budget
    budget used in W   = r(W) · W / P

A rule ``(severity, rate R, long window L, short window S)`` fires when
*both* ``r(L) > R`` and ``r(S) > R``: the long window proves the budget spend is
significant (``R · L / P`` of the budget, e.g. 14.4 · 1 h / 30 d = 2 %), the
short window proves it is still happening, so the alert resets within ``S``
once the cause is gone. The workbook's recommended rules for a 30-day budget::

    severity  rate   long  short   budget used when it fires
    page      14.4×  1 h   5 m      2 %
    page       6×    6 h   30 m     5 %
    ticket     3×    1 d   2 h     10 %
    ticket     1×    3 d   6 h     10 %

The rates are written for a 30-day budget (:attr:`BurnPolicy.period_ms`); an
SLO with another period ``P′`` is held to ``R · P′ / 30 d`` so that each rule
still means "this share of the budget is gone".

Detection time. After a step to a constant bad fraction ``f`` on steady
traffic, ``r(L)`` grows linearly while the long window fills with bad events
and crosses ``R`` after ``(1 − target) / f · L · R`` (workbook, "time to
detect")::

    (100 % bad from onset, 99 % SLO, 60 requests a minute)
    minutes after onset   0    1    2    …    5    …    8    9
    bad in the 1 h window 0   60  120   …  300   …  480  540  (of 3 600)
    r(1 h)                0  1.7  3.3   …  8.3   … 13.3 15.0  > 14.4 → page at minute 9
    r(5 m)                0   20   40   …  100   …  100  100  (full of bad requests)
                          └──── 0.01 · 60 min · 14.4 = 8.64 min ────┘

Minimum-traffic gate. One failed request among six in an hour is a 17 % bad
fraction, a 17× burn rate against a 99 % SLO: a quiet series would page on
noise. A rule therefore fires only when its long window holds at least
:attr:`BurnPolicy.min_long_events` eligible *requests* (default 100) and its
short window at least :attr:`BurnPolicy.min_short_events` (default 10); a rule
whose rates exceed but whose traffic does not is reported as ``gated``. The
gate counts requests, never ITL gaps, so one stalled stream of fifty slow
gaps cannot open it alone.

SLIs (``SloSpec.sli``) and the :class:`~tailguard.streams.counters.Counters`
fields they read (counted at ingest against the series' ``Thresholds``, so
an SLO's thresholds must be the series' thresholds: see :func:`thresholds_for`)::

    sli        eligible events (total)             bad
    ttft_ms    ttft_total (ok requests with TTFT)   ttft_total − ttft_good
    itl_ms     itl_total  (streamed gaps)           itl_total − itl_good
    e2e_ms     e2e_total  (ok requests)             e2e_total − e2e_good
    success    requests − cancelled                 errors (error, timeout, rejected)
    goodput    requests − cancelled                 total − good_requests
    composite  ttft_total                           total · (w_ttft·f_ttft + w_itl·f_itl)

Cancelled requests are left out of ``success`` and ``goodput``: the client
ended them, so they say nothing about the service either way. ``composite`` is
the article's 0.7·TTFT + 0.3·ITL compliance; its bad fraction is the weighted
bad fraction ``w_ttft·f_ttft + w_itl·f_itl`` (``1 −`` the composite), counted
per request so the traffic gate means the same as for TTFT. A window without
ITL gaps (no streamed output) has an undefined ITL term: the weights are then
renormalised over the terms that have data (the composite equals TTFT
compliance), which neither hides nor invents ITL trouble. ``tpot_ms`` has no
exact counters (Counters keeps none), so it is not an SLO SLI; TPOT is held
through ``goodput``.

Budget remaining. ``1 − f(B) / (1 − target)`` where ``B`` is the longest
window available that is not longer than the SLO period: the 30-day budget is
*projected* from the 3-day window (the ring keeps 3 days), i.e. it answers
"how much budget would be left if the whole period ran as the last 3 days
did". It is exact when a window of the full period is passed in, and goes
negative when the budget is overspent.
"""

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from tailguard.streams.counters import Counters
from tailguard.streams.errors import ConfigError
from tailguard.streams.selector import Selector
from tailguard.streams.slo import (
    LATENCY_SLIS,
    SLIS,
    SLO_PERIOD_MS,
    SloSpec,
    applicable,
    compared_values,
    thresholds_for,
    window_ms,
)

__all__ = [
    "DEFAULT_RULES",
    "EXCEED_TOLERANCE",
    "LATENCY_SLIS",
    "SEVERITIES",
    "SLIS",
    "SLO_PERIOD_MS",
    "BurnPolicy",
    "BurnRule",
    "Firing",
    "Selector",
    "Severity",
    "SloSpec",
    "Verdict",
    "allowed_bad",
    "applicable",
    "bad_and_total",
    "burn_rate",
    "eligible_requests",
    "evaluate",
    "goodput_rps",
    "thresholds_for",
    "time_to_detect_ms",
    "window_ms",
]

Severity = Literal["ticket", "page"]
#: Severities, least urgent first.
SEVERITIES: tuple[Severity, ...] = ("ticket", "page")
#: Relative slack below which a rate "equals" a threshold rather than exceeding it.
EXCEED_TOLERANCE = 1e-9


# ------------------------------------------------------------------ SLI maths


def bad_and_total(spec: SloSpec, counters: Counters) -> tuple[float, float]:
    """Bad and eligible events of ``spec``'s SLI in one window (module docstring table)."""
    c = counters
    sli = spec.sli
    if sli == "ttft_ms":
        return c.ttft_total - c.ttft_good, c.ttft_total
    if sli == "itl_ms":
        return c.itl_total - c.itl_good, c.itl_total
    if sli == "e2e_ms":
        return c.e2e_total - c.e2e_good, c.e2e_total
    if sli == "success":
        return c.errors, c.requests - c.cancelled
    if sli == "goodput":
        total = c.requests - c.cancelled
        return total - c.good_requests, total
    # composite: weighted bad fraction over the terms that have data, per request.
    total = c.ttft_total
    if total == 0:
        return 0.0, 0
    terms = [(spec.ttft_weight, (c.ttft_total - c.ttft_good) / c.ttft_total)]
    if c.itl_total:
        terms.append((spec.itl_weight, (c.itl_total - c.itl_good) / c.itl_total))
    weight = sum(w for w, _ in terms)
    if weight == 0.0:  # only a zero-weight term has data
        return 0.0, total
    return total * sum(w * f for w, f in terms) / weight, total


def eligible_requests(spec: SloSpec, counters: Counters) -> int:
    """Requests behind ``spec``'s SLI in a window: what the minimum-traffic gate counts."""
    c = counters
    if spec.sli in ("ttft_ms", "composite"):
        return c.ttft_total
    if spec.sli == "e2e_ms":
        return c.e2e_total
    if spec.sli == "itl_ms":
        return c.requests - c.errors - c.cancelled
    return c.requests - c.cancelled


def burn_rate(bad: float, total: float, target: float) -> float:
    """``(bad / total) / (1 − target)``; 0 for an empty window."""
    if total <= 0:
        return 0.0
    return (bad / total) / allowed_bad(target)


def allowed_bad(target: float) -> float:
    """``1 − target``, rounded so that 1 − 0.999 is 0.001 exactly."""
    return round(1.0 - target, 12)


def goodput_rps(counters: Counters, window_ms: int) -> float:
    """Goodput (DistServe; vLLM ``bench serve --goodput``): good requests per second.

    A request is good when it succeeded and met every latency threshold of its
    series (``Counters.good_requests``). ``window_ms`` is the time the counters
    cover: pass the covered span, not the nominal window, for a young series.
    """
    if window_ms <= 0:
        msg = f"goodput window must be > 0 ms, got {window_ms}"
        raise ConfigError(msg)
    return counters.good_requests * 1_000 / window_ms


def time_to_detect_ms(bad_fraction: float, target: float, long_ms: int, rate: float) -> float:
    """Workbook detection time of a rule after a step to a constant bad fraction.

    ``(1 − target) / bad_fraction · long_ms · rate``; infinite when the bad
    fraction never reaches ``rate`` times the budget.
    """
    budget = round(1.0 - target, 12)
    if bad_fraction <= rate * budget:
        return math.inf
    return budget / bad_fraction * long_ms * rate


# ------------------------------------------------------------------ the policy


@dataclass(frozen=True, slots=True)
class BurnRule:
    """Fire at ``severity`` when both windows burn faster than ``rate``."""

    severity: Severity
    rate: float
    long: str
    short: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            msg = f"rule severity must be one of {SEVERITIES}, got {self.severity!r}"
            raise ConfigError(msg)
        if not (self.rate > 0 and math.isfinite(self.rate)):
            msg = f"rule burn rate must be a finite number > 0, got {self.rate!r}"
            raise ConfigError(msg)
        if window_ms(self.short) >= window_ms(self.long):
            msg = f"rule short window {self.short} must be shorter than its long window {self.long}"
            raise ConfigError(msg)

    @property
    def name(self) -> str:
        """E.g. ``page 14.4x 1h/5m``."""
        return f"{self.severity} {self.rate:g}x {self.long}/{self.short}"

    def budget_consumed(self, period_ms: int = SLO_PERIOD_MS) -> float:
        """Share of a ``period_ms`` budget spent when the long window fires: ``rate · L / P``."""
        return self.rate * window_ms(self.long) / period_ms


#: SRE workbook, "Multiwindow, multi-burn-rate alerts", for a 30-day budget.
DEFAULT_RULES: tuple[BurnRule, ...] = (
    BurnRule("page", 14.4, "1h", "5m"),
    BurnRule("page", 6.0, "6h", "30m"),
    BurnRule("ticket", 3.0, "1d", "2h"),
    BurnRule("ticket", 1.0, "3d", "6h"),
)


@dataclass(frozen=True, slots=True)
class BurnPolicy:
    """Alerting rules, the period their rates are written for, and the traffic gate."""

    rules: tuple[BurnRule, ...] = DEFAULT_RULES
    min_long_events: int = 100
    min_short_events: int = 10
    period_ms: int = SLO_PERIOD_MS
    #: The window budget_remaining is projected from when no longer one is passed.
    budget_window: str = "3d"
    #: The hash, worked out once (see :class:`SloSpec`).
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        return self._hash

    def __post_init__(self) -> None:
        if not self.rules:
            msg = "a burn policy needs at least one rule"
            raise ConfigError(msg)
        for name in ("min_long_events", "min_short_events"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                msg = f"{name} must be an integer ≥ 0, got {value!r}"
                raise ConfigError(msg)
        if self.period_ms <= 0:
            msg = f"period_ms must be > 0, got {self.period_ms}"
            raise ConfigError(msg)
        window_ms(self.budget_window)
        object.__setattr__(self, "_hash", hash(compared_values(self)))

    @property
    def windows(self) -> Mapping[str, int]:
        """Every window the rules and the budget read, name → ms, shortest first."""
        return _policy_windows(self.rules, self.budget_window)

    def threshold(self, rule: BurnRule, spec: SloSpec) -> float:
        """The rule's rate for ``spec``'s period: ``rate · P_spec / P_policy``."""
        return rule.rate * spec.window_ms / self.period_ms


@functools.lru_cache(maxsize=64)
def _policy_windows(rules: tuple[BurnRule, ...], budget_window: str) -> Mapping[str, int]:
    """:attr:`BurnPolicy.windows`, worked out once per policy (read at every close)."""
    names = {budget_window}
    for rule in rules:
        names.update((rule.long, rule.short))
    return MappingProxyType({n: window_ms(n) for n in sorted(names, key=window_ms)})


# ------------------------------------------------------------------ evaluation


@dataclass(frozen=True, slots=True)
class Firing:
    """A rule whose two windows both burn faster than its threshold."""

    rule: BurnRule
    threshold: float
    long_rate: float
    short_rate: float


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :func:`evaluate` found for one SLO of one series at one point of event time.

    ``burn_rates``, ``sli`` (good fraction, ``1 − bad/total``) and ``events``
    (eligible requests) are keyed by window name; ``sli`` omits windows without
    events. ``gated`` holds the rules whose rates exceed but whose windows hold
    too few requests to trust.
    """

    slo: str
    severity: Severity | None
    firing: tuple[Firing, ...] = ()
    gated: tuple[Firing, ...] = ()
    burn_rates: Mapping[str, float] = field(default_factory=dict)
    sli: Mapping[str, float] = field(default_factory=dict)
    events: Mapping[str, int] = field(default_factory=dict)
    budget_remaining: float | None = None
    budget_window: str | None = None

    @property
    def fired(self) -> bool:
        return self.severity is not None


def _exceeds(rate: float, threshold: float) -> bool:
    return rate > threshold * (1.0 + EXCEED_TOLERANCE)


def evaluate(
    spec: SloSpec, policy: BurnPolicy, counters_by_window: Mapping[str, Counters]
) -> Verdict:
    """Burn rates, firing rules and budget of ``spec`` from the counters of each window.

    ``counters_by_window`` maps window names (``"1h"``, ``"2h"``, ``"30d"``…) to
    the counters of the window ending at the evaluation point; it must hold
    every window of ``policy.windows`` except the budget window (see
    :func:`window_counters`). Severity is the highest severity among the rules
    that fire and pass the traffic gate.
    """
    missing = sorted(
        {n for r in policy.rules for n in (r.long, r.short)} - set(counters_by_window),
        key=window_ms,
    )
    if missing:
        msg = f"counters for windows {missing} are missing: pass every window of policy.windows"
        raise ConfigError(msg)
    rates: dict[str, float] = {}
    sli: dict[str, float] = {}
    events: dict[str, int] = {}
    allowed = allowed_bad(spec.target)
    for name in sorted(counters_by_window, key=window_ms):
        counters = counters_by_window[name]
        bad, total = bad_and_total(spec, counters)
        rates[name] = (bad / total) / allowed if total > 0 else 0.0
        events[name] = eligible_requests(spec, counters)
        if total > 0:
            sli[name] = 1.0 - bad / total
    firing: list[Firing] = []
    gated: list[Firing] = []
    for rule in policy.rules:
        threshold = policy.threshold(rule, spec)
        long_rate, short_rate = rates[rule.long], rates[rule.short]
        if not (_exceeds(long_rate, threshold) and _exceeds(short_rate, threshold)):
            continue
        hit = Firing(rule, threshold, long_rate, short_rate)
        enough = (
            events[rule.long] >= policy.min_long_events
            and events[rule.short] >= policy.min_short_events
        )
        (firing if enough else gated).append(hit)
    severity: Severity | None = None
    for hit in firing:
        if severity is None or SEVERITIES.index(hit.rule.severity) > SEVERITIES.index(severity):
            severity = hit.rule.severity
    budget_remaining: float | None = None
    budget_name: str | None = None
    candidates = [n for n in counters_by_window if window_ms(n) <= spec.window_ms]
    if candidates:
        budget_name = max(candidates, key=window_ms)
        bad, total = bad_and_total(spec, counters_by_window[budget_name])
        budget_remaining = 1.0 - burn_rate(bad, total, spec.target)
    return Verdict(
        slo=spec.name,
        severity=severity,
        firing=tuple(firing),
        gated=tuple(gated),
        burn_rates=rates,
        sli=sli,
        events=events,
        budget_remaining=budget_remaining,
        budget_window=budget_name,
    )
