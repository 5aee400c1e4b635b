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
"""

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tailguard.streams.errors import ConfigError

__all__ = ["Knee", "KneeConfig", "KneeTracker", "LoadSample", "find_knee"]


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
    #: A new knee is published when it moves by more than this fraction.
    change_tolerance: float = 0.1

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


@dataclass(frozen=True, slots=True)
class Knee:
    """A knee, or the reason there is none (``concurrency`` is None)."""

    concurrency: float | None
    p95_ms: float | None = None
    tokens_per_s: float | None = None
    samples: int = 0
    bins: int = 0
    reason: str = "ok"

    def evidence(self) -> dict[str, Any]:
        return {
            "knee_concurrency": None if self.concurrency is None else round(self.concurrency, 3),
            "knee_p95_ms": None if self.p95_ms is None else round(self.p95_ms, 3),
            "knee_tokens_per_s": None if self.tokens_per_s is None else round(self.tokens_per_s, 3),
            "samples": self.samples,
            "bins": self.bins,
            "reason": self.reason,
        }


def find_knee(samples: list[LoadSample], config: KneeConfig | None = None) -> Knee:
    """The Kneedle knee of P95 over concurrency, or a refusal with its reason."""
    cfg = config or KneeConfig()
    n = len(samples)
    if n < cfg.min_samples:
        return Knee(None, samples=n, reason=f"too_few_samples ({n} < {cfg.min_samples})")
    conc = np.array([s.concurrency for s in samples], dtype=np.float64)
    p95 = np.array([s.p95_ms for s in samples], dtype=np.float64)
    tps = np.array([s.tokens_per_s for s in samples], dtype=np.float64)
    top = float(conc.max())
    if top <= 0:
        return Knee(None, samples=n, reason="no_load")
    width = top * cfg.bin_fraction
    idx = np.floor(conc / width).astype(np.int64)
    bins = np.unique(idx)
    if len(bins) < cfg.min_bins:
        return Knee(
            None, samples=n, bins=len(bins), reason=f"too_few_bins ({len(bins)} < {cfg.min_bins})"
        )
    x = np.array([np.median(conc[idx == b]) for b in bins])
    y = np.array([np.median(p95[idx == b]) for b in bins])
    t = np.array([np.median(tps[idx == b]) for b in bins])
    if y[0] <= 0 or y.max() / y[0] < cfg.min_rise:
        return Knee(None, samples=n, bins=len(bins), reason="latency_never_rises")
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
    return Knee(float(x[k]), float(y[k]), float(t[k]), samples=n, bins=len(bins), reason="kneedle")


@dataclass(slots=True)
class KneeTracker:
    """The sliding sample history of one deployment and its current knee."""

    config: KneeConfig = field(default_factory=KneeConfig)
    samples: deque[LoadSample] = field(default_factory=deque)
    current: Knee = field(default_factory=lambda: Knee(None, reason="no_data"))
    published: float | None = None

    def add(self, sample: LoadSample) -> Knee | None:
        """Add a sample; return the knee when it changed enough to publish, else None."""
        self.samples.append(sample)
        while len(self.samples) > self.config.history:
            self.samples.popleft()
        self.current = find_knee(list(self.samples), self.config)
        c = self.current.concurrency
        if c is None:
            return None
        last = self.published
        if last is None or abs(c - last) > self.config.change_tolerance * last:
            self.published = c
            return self.current
        return None
