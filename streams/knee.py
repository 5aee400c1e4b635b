"""Throughput knee of a deployment (service, model) from per-interval load samples.

Each closed interval gives one sample: concurrency (Little's law, see
:mod:`tailguard.streams.capacity`), P95 latency and tokens/s. Plotted as P95
against concurrency, a serving deployment's curve is flat while the batcher
absorbs load and turns up steeply once requests queue::

    P95 │                              ·
        │                            ·
        │                         ·
        │ · · · · · · · · · · ·*          * = the knee: the last stable,
        └──────────────────────────── concurrency   high-throughput point

The knee is found with Kneedle (Satopää, Albrecht, Irwin, Raghavan 2011,
"Finding a 'Kneedle' in a Haystack"): bin the samples by concurrency, take the
median P95 per bin, normalise both axes to [0, 1] and pick the point with the
largest distance below the diagonal, ``d_i = x̂_i − ŷ_i`` (the curve is convex
and increasing); then step back to the last bin whose P95 is still within
``stable_rise`` (25%) of the low-load baseline, because Kneedle's point on a
gradual rise already lies on the slope. Written here rather than taken from ``kneed`` because it is
twenty lines of numpy and ``kneed`` would pull in scipy/matplotlib at run time.

No knee is claimed from too little data: fewer than ``min_samples``
samples, fewer than ``min_bins`` populated concurrency bins, or a curve that
never rises by ``min_rise`` (max P95 / P95 at the lowest load) — a deployment
that was never pushed has no knee yet, only a lower bound.

Publication (:class:`KneeTracker`). On ordinary noisy traffic the estimate
wanders: long requests raise both an interval's concurrency and its P95, so
the curve has spurious knees, and Kneedle's argmax jumps between them as the
history slides (the demo's search-rag: 2.1 ↔ 3.4 ↔ 8.0, each held for minutes;
with "publish any 10 % move", 19–36 knee records in 2 h). A knee K of the latest
evaluation is a *candidate* when

    sure:    the central ``confidence`` (95 %) interval [lo, hi] of the knee over
             ``bootstrap`` (100) resamples of the history (Efron's percentile
             bootstrap) has hi − lo ≤ 2·max_spread·K (±25 %);
    moved:   |K − P| > change_tolerance·P (10 %), and P ∉ [lo − band, hi + band]
             (P the published knee, band = change_tolerance·P): the move exceeds
             the dead band and the new knee's own uncertainty.

The first candidate is published at once (scaling needs a knee); after that,
when ``confirm_min`` (4) of the last ``confirm_window`` (6) evaluations gave
candidates on the same side of P, their (lower) median is published::

    evaluation   1   2   3   4   5   6   7
    candidate    ↑   ·   ↑   ↑   ·   ↑            ↑ beyond the band, sure; · none
    published                        median(↑↑↑↑) at 6 (4 of the last 6)

A real move of capacity is published once the history holds mostly the new
curve (a knee 8 → 16 under uniform load: 70–100 intervals with 240 kept).
"""

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from tailguard.streams.errors import ConfigError

__all__ = [
    "Knee",
    "KneeConfig",
    "KneeTracker",
    "LoadSample",
    "bootstrap_interval",
    "find_knee",
]


@dataclass(frozen=True, slots=True)
class LoadSample:
    """One closed interval of one deployment."""

    ts_ms: int
    concurrency: float
    p95_ms: float
    tokens_per_s: float


@dataclass(frozen=True, slots=True)
class KneeConfig:
    """How much data a knee needs and how samples are binned."""

    #: Samples kept (a sliding history, so the knee follows changing traffic).
    history: int = 240
    min_samples: int = 12
    min_bins: int = 5
    #: Bin width as a fraction of the largest concurrency seen.
    bin_fraction: float = 0.05
    #: The curve must rise at least this much (max / first-bin P95) to have a knee.
    min_rise: float = 1.5
    #: The knee is the last bin at or before Kneedle's point whose P95 is within
    #: this fraction of the low-load baseline (the "last stable" point).
    stable_rise: float = 0.25
    #: Dead band: a knee moves only beyond this fraction of the published one.
    change_tolerance: float = 0.1
    #: Evaluations (intervals) a new knee must hold over: ``confirm_min`` of the
    #: last ``confirm_window`` must find it (beyond the dead band, on one side).
    confirm_window: int = 6
    confirm_min: int = 4
    #: Bootstrap resamples of the history for a moved knee's uncertainty, and the
    #: central interval that must exclude the published knee.
    bootstrap: int = 50
    confidence: float = 0.95
    #: A knee is claimed only when that interval's half-width is at most this
    #: fraction of it (else the curve's knee is a matter of noise).
    max_spread: float = 0.25

    def __post_init__(self) -> None:
        if self.min_samples < 3 or self.min_bins < 3:
            msg = "min_samples and min_bins must be ≥ 3 (a knee needs a curve)"
            raise ConfigError(msg)
        if not 0 < self.bin_fraction < 1:
            msg = f"bin_fraction must be in (0, 1), got {self.bin_fraction}"
            raise ConfigError(msg)
        if self.history < self.min_samples:
            msg = "history must be ≥ min_samples"
            raise ConfigError(msg)
        if not 0 < self.confirm_window < 2 * self.confirm_min <= 2 * self.confirm_window:
            msg = (
                "need confirm_window/2 < confirm_min ≤ confirm_window (a majority of the"
                f" last evaluations), got {self.confirm_min} of {self.confirm_window}"
            )
            raise ConfigError(msg)
        if self.bootstrap < 10 or not 0 < self.confidence < 1:
            msg = "bootstrap must be ≥ 10 resamples and confidence in (0, 1)"
            raise ConfigError(msg)


@dataclass(frozen=True, slots=True)
class Knee:
    """A knee, or the reason there is none (``concurrency`` is None)."""

    concurrency: float | None
    p95_ms: float | None = None
    tokens_per_s: float | None = None
    samples: int = 0
    bins: int = 0
    reason: str = "ok"
    #: Set on a published knee: the knee it replaces, how many of the last
    #: evaluations confirmed it, and (on a move) its bootstrap interval.
    previous: float | None = None
    confirmed: int = 0
    low: float | None = None
    high: float | None = None

    def evidence(self) -> dict[str, Any]:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 3)

        return {
            "knee_concurrency": r(self.concurrency),
            "knee_p95_ms": r(self.p95_ms),
            "knee_tokens_per_s": r(self.tokens_per_s),
            "samples": self.samples,
            "bins": self.bins,
            "reason": self.reason,
            "previous_knee": r(self.previous),
            "confirmed": self.confirmed,
            "interval_low": r(self.low),
            "interval_high": r(self.high),
        }


def find_knee(samples: list[LoadSample], config: KneeConfig | None = None) -> Knee:
    """The Kneedle knee of P95 over concurrency, or a refusal with its reason."""
    cfg = config or KneeConfig()
    n = len(samples)
    if n < cfg.min_samples:
        return Knee(None, samples=n, reason=f"too_few_samples ({n} < {cfg.min_samples})")
    cols = np.array([(s.concurrency, s.p95_ms, s.tokens_per_s) for s in samples], dtype=np.float64)
    return _kneedle(cols[:, 0], cols[:, 1], cols[:, 2], cfg)


def _bin_medians(
    idx: npt.NDArray[np.int64], *columns: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float64], ...]:
    """Per bin (sorted by bin), the median of each column — ``np.median`` of each group."""
    _, inverse, counts = np.unique(idx, return_inverse=True, return_counts=True)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    lo, hi = starts + (counts - 1) // 2, starts + counts // 2
    out = []
    for v in columns:
        s = v[np.lexsort((v, inverse))]
        out.append((s[lo] + s[hi]) / 2)
    return tuple(out)


def _kneedle(
    conc: npt.NDArray[np.float64],
    p95: npt.NDArray[np.float64],
    tps: npt.NDArray[np.float64],
    cfg: KneeConfig,
    width: float | None = None,
) -> Knee:
    n = len(conc)
    top = float(conc.max())
    if top <= 0:
        return Knee(None, samples=n, reason="no_load")
    width = width or top * cfg.bin_fraction
    idx = np.floor(conc / width).astype(np.int64)
    nbins = len(np.unique(idx))
    if nbins < cfg.min_bins:
        return Knee(None, samples=n, bins=nbins, reason=f"too_few_bins ({nbins} < {cfg.min_bins})")
    x, y, t = _bin_medians(idx, conc, p95, tps)
    if y[0] <= 0 or y.max() / y[0] < cfg.min_rise:
        return Knee(None, samples=n, bins=nbins, reason="latency_never_rises")
    # Kneedle on a convex increasing curve: maximise x̂ − ŷ.
    xn = (x - x[0]) / (x[-1] - x[0])
    yn = (y - y.min()) / (y.max() - y.min())
    k = int(np.argmax(xn - yn))
    # Kneedle's point is where the curve's slope matches the diagonal's — on a
    # gradual rise already past the stable region. Walk back to the last bin whose
    # P95 is still within ``stable_rise`` of the low-load baseline.
    base = float(np.median(y[: min(3, len(y))]))
    stable = np.nonzero(y[: k + 1] <= base * (1 + cfg.stable_rise))[0]
    if len(stable):
        k = int(stable[-1])
    return Knee(float(x[k]), float(y[k]), float(t[k]), samples=n, bins=nbins, reason="kneedle")


def bootstrap_interval(
    samples: list[LoadSample], config: KneeConfig | None = None, *, seed: int = 0
) -> tuple[float, float] | None:
    """The central ``confidence`` interval of the knee over bootstrap resamples of ``samples``.

    ``config.bootstrap`` resamples with replacement (Efron's percentile interval),
    binned on the history's own grid. Seeded, so the same samples give the same
    interval and a restored worker decides as the one it replaces. None when
    fewer than half the resamples find a knee: the knee is not even sure to exist.
    """
    cfg = config or KneeConfig()
    if len(samples) < cfg.min_samples:
        return None
    cols = np.array([(s.concurrency, s.p95_ms, s.tokens_per_s) for s in samples], dtype=np.float64)
    if cols[:, 0].max() <= 0:
        return None
    knees = _bootstrap_knees(cols, cfg, np.random.default_rng(seed))
    knees = knees[~np.isnan(knees)]
    if 2 * len(knees) < cfg.bootstrap:
        return None
    tail = (1 - cfg.confidence) / 2 * 100
    lo, hi = np.percentile(knees, [tail, 100 - tail])
    return float(lo), float(hi)


def _bootstrap_knees(
    cols: npt.NDArray[np.float64], cfg: KneeConfig, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """:func:`_kneedle` of ``cfg.bootstrap`` resamples at once (NaN: no knee).

    Row r is ``_kneedle(cols[draws[r]], width=history's width)``, vectorised: one
    lexsort gives every (resample, bin) median, so 100 resamples cost about as
    much as three plain evaluations.
    """
    n, reps = len(cols), cfg.bootstrap
    width = float(cols[:, 0].max()) * cfg.bin_fraction
    _, b = np.unique(np.floor(cols[:, 0] / width).astype(np.int64), return_inverse=True)
    nb = int(b.max()) + 1
    draws = rng.integers(0, n, size=(reps, n))
    group = (np.arange(reps)[:, None] * nb + b[draws]).ravel()
    counts = np.bincount(group, minlength=reps * nb)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    lo = np.minimum(starts + np.maximum(counts - 1, 0) // 2, n * reps - 1)
    hi = np.minimum(starts + counts // 2, n * reps - 1)
    has = (counts > 0).reshape(reps, nb)

    def medians(v: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        vals = v[draws].ravel()
        srt = vals[np.lexsort((vals, group))]
        return np.where(has, ((srt[lo] + srt[hi]) / 2).reshape(reps, nb), np.nan)

    x, y = medians(cols[:, 0]), medians(cols[:, 1])
    rows = np.arange(reps)
    first = np.argmax(has, axis=1)
    last = nb - 1 - np.argmax(has[:, ::-1], axis=1)
    y0 = y[rows, first]
    with np.errstate(invalid="ignore", divide="ignore"):
        ymax, ymin = np.nanmax(y, axis=1), np.nanmin(y, axis=1)
        ok = (has.sum(axis=1) >= cfg.min_bins) & (y0 > 0) & (ymax / y0 >= cfg.min_rise)
        xn = (x - x[rows, first][:, None]) / (x[rows, last] - x[rows, first])[:, None]
        yn = (y - ymin[:, None]) / (ymax - ymin)[:, None]
    k = np.argmax(np.where(has & ok[:, None], xn - yn, -np.inf), axis=1)
    order = np.argsort(~has, axis=1, kind="stable")[:, :3]
    base = np.median(np.take_along_axis(y, order, axis=1), axis=1)
    cols_idx = np.arange(nb)[None, :]
    with np.errstate(invalid="ignore"):
        stable = has & (cols_idx <= k[:, None]) & (y <= (base * (1 + cfg.stable_rise))[:, None])
    back = nb - 1 - np.argmax(stable[:, ::-1], axis=1)
    k = np.where(stable.any(axis=1), back, k)
    return np.where(ok, x[rows, k], np.nan)


@dataclass(slots=True)
class KneeTracker:
    """The sliding sample history of one deployment, its latest and its published knee.

    Each evaluation yields a *candidate* (or None): the latest knee when it is
    sure and, once a knee was published, beyond the dead band and its own
    uncertainty. The first candidate is published at once; later, a move needs
    ``confirm_min`` of the last ``confirm_window`` candidates on one side, and the
    median of those is published (see the module docstring).
    """

    config: KneeConfig = field(default_factory=KneeConfig)
    samples: deque[LoadSample] = field(default_factory=deque)
    current: Knee = field(default_factory=lambda: Knee(None, reason="no_data"))
    published: float | None = None
    #: The knees of the last ``confirm_window`` evaluations (None: no knee found).
    recent: deque[Knee | None] = field(default_factory=deque)

    def add(self, sample: LoadSample) -> Knee | None:
        """Add a sample; return the knee when it is sure (and, after the first, moved).

        A sample no newer than the history's newest is ignored: intervals close in
        order, so it is one applied already (a replay after a crash between the
        capacity agent's knee and core writes, which are two records).
        """
        cfg = self.config
        if self.samples and sample.ts_ms <= self.samples[-1].ts_ms:
            return None
        self.samples.append(sample)
        while len(self.samples) > cfg.history:
            self.samples.popleft()
        self.current = find_knee(list(self.samples), cfg)
        self.recent.append(self._candidate(sample.ts_ms))
        while len(self.recent) > cfg.confirm_window:
            self.recent.popleft()
        last = self.published
        if last is None:
            knee, agree = self.recent[-1], 1  # the first sure knee at once: scaling needs one
            if knee is None:
                return None
        else:
            found = [k for k in self.recent if k is not None and k.concurrency is not None]
            above = [k for k in found if k.concurrency > last]  # type: ignore[operator]
            below = [k for k in found if k.concurrency < last]  # type: ignore[operator]
            moved = above if len(above) >= len(below) else below
            if len(moved) < cfg.confirm_min:
                return None
            knee, agree = _median(moved), len(moved)
        self.published = knee.concurrency
        return replace(knee, previous=last, confirmed=agree)

    def _candidate(self, ts_ms: int) -> Knee | None:
        """The latest knee if it is sure and (after the first) beyond band and uncertainty."""
        cfg, knee, last = self.config, self.current, self.published
        c = knee.concurrency
        if c is None:
            return None
        band = 0.0 if last is None else cfg.change_tolerance * last
        if last is not None and abs(c - last) <= band:
            return None
        interval = bootstrap_interval(list(self.samples), cfg, seed=ts_ms + len(self.samples))
        if interval is None or interval[1] - interval[0] > 2 * cfg.max_spread * c:
            return None  # not sure where the knee is
        if last is not None and interval[0] - band <= last <= interval[1] + band:
            return None  # the published knee is still a plausible knee of this history
        return replace(knee, low=interval[0], high=interval[1])


def _median(knees: list[Knee]) -> Knee:
    """The lower median by concurrency: an estimate that was made, with its P95 and tokens/s."""
    ranked = sorted(knees, key=lambda k: k.concurrency or 0.0)
    return ranked[(len(ranked) - 1) // 2]
