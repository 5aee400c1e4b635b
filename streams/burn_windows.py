"""A series' burn windows at a minute's close: their counters, read when first
needed, and which SLOs burn.

Most series are quiet at most closes. Where nobody reads a verdict (no open
breach, not on ``/metrics``) the close only asks whether
:func:`~tailguard.streams.burn.evaluate` would give a severity
(:func:`fires_each`, for all the SLOs of a series at once), and reads a rule's
long window only when its short window burns. A minute's close asks it first
of all the series that closed at once (:func:`short_windows_burn`, a few numpy
passes): only those where some rule's short window burns need
:func:`fires_each`.
"""

import functools
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain
from operator import attrgetter
from types import SimpleNamespace

import numpy as np
from tailguard.streams.burn import (
    EXCEED_TOLERANCE,
    BurnPolicy,
    BurnRule,
    SloSpec,
    allowed_bad,
    bad_and_total,
    eligible_requests,
)
from tailguard.streams.counters import Counters
from tailguard.streams.ring import SeriesRing

__all__ = [
    "WindowCounters",
    "fires",
    "fires_each",
    "short_windows",
    "short_windows_burn",
    "window_counters",
]


def fires(spec: SloSpec, policy: BurnPolicy, counters_by_window: Mapping[str, Counters]) -> bool:
    """Whether :func:`~tailguard.streams.burn.evaluate` would give a severity (a
    rule fires and passes the traffic gate), without building its verdict.

    Most series are quiet at most closes; where nobody reads the verdict (no
    open breach, not on ``/metrics``) this is all the close needs to know.
    ``counters_by_window`` as for :func:`evaluate`.
    """
    return fires_each((spec,), policy, counters_by_window)[0]


def fires_each(
    specs: Sequence[SloSpec], policy: BurnPolicy, counters_by_window: Mapping[str, Counters]
) -> list[bool]:
    """:func:`fires` of each of ``specs``, all read from one series' windows.

    The SLOs of a series read the same windows, and windows holding the same
    buckets share one counters object (a young series' windows all do): each
    window is looked up once for all the SLOs, and each SLI's bad and eligible
    events are worked out once per counters object, whatever the number of
    SLOs and rules reading them. A rule's long window is read only when its
    short window burns.
    """
    windows: dict[str, Counters] = {}
    # (id of a counters object, SLI key) -> bad and eligible events. An entry
    # is only read while ``windows`` keeps its counters alive, so no id is reused.
    tallies: dict[tuple[int, object], tuple[float, float]] = {}

    def rate(name: str, spec: SloSpec, allowed: float) -> float:
        counters = windows.get(name)
        if counters is None:
            counters = windows[name] = counters_by_window[name]
        key = (id(counters), _sli_key(spec))
        found = tallies.get(key)
        if found is None:
            found = tallies[key] = bad_and_total(spec, counters)
        bad, total = found
        return (bad / total) / allowed if total > 0 else 0.0

    out = []
    for spec in specs:
        allowed, rules = _rule_limits(spec, policy)
        burning = False
        for rule, limit in rules:
            if not (
                rate(rule.short, spec, allowed) > limit and rate(rule.long, spec, allowed) > limit
            ):
                continue
            if (
                eligible_requests(spec, windows[rule.long]) >= policy.min_long_events
                and eligible_requests(spec, windows[rule.short]) >= policy.min_short_events
            ):
                burning = True
                break
        out.append(burning)
    return out


#: The counters an SLI reads (:func:`~tailguard.streams.burn.bad_and_total`).
_FIELDS = (
    "requests",
    "errors",
    "cancelled",
    "good_requests",
    "ttft_total",
    "ttft_good",
    "itl_total",
    "itl_good",
    "e2e_total",
    "e2e_good",
)
_read_fields = attrgetter(*_FIELDS)


def short_windows_burn(
    policy: BurnPolicy, closes: Sequence[tuple[Sequence[SloSpec], Mapping[str, Counters]]]
) -> list[bool]:
    """For each close — its SLOs and its windows' counters — whether a rule's
    short window burns for one of its SLOs: the first test of :func:`fires_each`,
    for many series at once.

    Where this is False, :func:`fires_each` gives False for every SLO of the
    close (a rule fires only when its short window burns too); where it is
    True, :func:`fires_each` decides. It never says False where a rule's short
    window burns: the rates are worked out as :func:`fires_each` works them
    out, and a composite SLI's bad fraction, a weighted mean of its TTFT and ITL
    fractions, is taken as the larger of the two. A close with no SLO is False,
    its windows not read.
    """
    burns = np.zeros(len(closes), dtype=bool)
    judged = [i for i, (specs, _) in enumerate(closes) if specs]  # no SLO: nothing to read
    if not judged:
        return burns.tolist()
    shorts, _ = short_windows(policy)
    column = {name: i for i, name in enumerate(shorts)}
    read = (_read_fields(closes[i][1][name]) for i in judged for name in shorts)
    size = len(judged) * len(shorts) * len(_FIELDS)
    table = np.fromiter(chain.from_iterable(read), dtype=np.int64, count=size)
    table = table.reshape(len(judged), len(shorts), len(_FIELDS))
    windows = SimpleNamespace(**{name: table[:, :, i] for i, name in enumerate(_FIELDS)})
    holding: dict[SloSpec, list[int]] = {}
    for row, i in enumerate(judged):
        for spec in closes[i][0]:
            holding.setdefault(spec, []).append(row)
    hot = np.zeros(len(judged), dtype=bool)
    for spec, at in holding.items():
        allowed, rules = _rule_limits(spec, policy)
        rates = _bad_fraction(spec, windows)[at] / allowed
        for rule, limit in rules:
            hot[at] |= rates[:, column[rule.short]] > limit
    burns[judged] = hot
    return burns.tolist()


@functools.lru_cache(maxsize=64)
def short_windows(policy: BurnPolicy) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Names (sorted) and lengths of the policy's short windows, which every rule reads first."""
    names = tuple(sorted({rule.short for rule in policy.rules}))
    return names, tuple(policy.windows[name] for name in names)


def _bad_fraction(spec: SloSpec, c: SimpleNamespace) -> np.ndarray:
    """``bad / total`` of ``spec``'s SLI in every window of ``c`` (0 where no
    events); for a composite SLI, the larger of its TTFT and ITL fractions."""
    if spec.sli == "composite":
        return np.maximum(
            _fraction(c.ttft_total - c.ttft_good, c.ttft_total),
            _fraction(c.itl_total - c.itl_good, c.itl_total),
        )
    return _fraction(*bad_and_total(spec, c))  # type: ignore[arg-type]


def _fraction(bad: np.ndarray, total: np.ndarray) -> np.ndarray:
    return np.divide(bad, total, out=np.zeros(total.shape), where=total > 0)


def _sli_key(spec: SloSpec) -> object:
    """What :func:`bad_and_total` reads of ``spec``: its SLI, and a composite's weights."""
    if spec.sli == "composite":
        return (spec.sli, spec.ttft_weight, spec.itl_weight)
    return spec.sli


@functools.lru_cache(maxsize=1024)
def _rule_limits(
    spec: SloSpec, policy: BurnPolicy
) -> tuple[float, tuple[tuple[BurnRule, float], ...]]:
    """``1 − target`` and, per rule, the rate a window must exceed (as
    :func:`~tailguard.streams.burn.evaluate` reckons it): worked out once per SLO
    and policy, read at every close."""
    limits = tuple(
        (rule, policy.threshold(rule, spec) * (1.0 + EXCEED_TOLERANCE)) for rule in policy.rules
    )
    return allowed_bad(spec.target), limits


class WindowCounters(Mapping[str, Counters]):
    """Counters of the policy's windows, all ending at one end, each summed when first
    read (``first``, names and lengths of some of them, at once when the end is given).

    Over three days of history a series' seven windows hold some 300 buckets.
    A quiet series at a minute's close needs only :func:`fires`, which reads a
    rule's long window only when its short window burns: most closes read the
    short windows alone (about a third of the additions).
    """

    def __init__(
        self,
        series: SeriesRing,
        windows: Mapping[str, int],
        end_ms: int | None,
        first: tuple[tuple[str, ...], tuple[int, ...]] = ((), ()),
    ) -> None:
        self._series = series
        self._windows = windows
        self._end_ms = end_ms
        self._read: dict[str, Counters] = {}
        names, lengths = first
        if names and end_ms is not None:
            # Read together: each is the newest part of the next, added up once.
            self._read = dict(zip(names, series.counters_many(lengths, end_ms), strict=True))

    def __getitem__(self, name: str) -> Counters:
        counters = self._read.get(name)
        if counters is None:
            window = self._windows[name]  # KeyError for a window the policy does not read
            counters = self._read[name] = self._series.counters(window, self._end_ms)
        return counters

    def __iter__(self) -> Iterator[str]:
        return iter(self._windows)

    def __len__(self) -> int:
        return len(self._windows)


def window_counters(
    series: SeriesRing, policy: BurnPolicy, end_ms: int | None = None
) -> WindowCounters:
    """Counters of every window ``policy`` reads, all ending at ``end_ms`` (each
    summed when first read).

    ``end_ms`` defaults to the end of the bucket holding the watermark; an
    agent evaluating a closed minute passes that minute's end. The short
    windows, which every evaluation reads, are then read at once where the
    series holds hours (its windows hold many buckets, each the newest part of
    the next); a younger series' windows are a few minutes, read one by one.
    """
    first = short_windows(policy) if end_ms is not None and series.coarse else ((), ())
    return WindowCounters(series, policy.windows, end_ms, first)
