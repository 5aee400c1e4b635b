"""Log-bucketed histograms: exact counts per bucket of relative width 1 %.

The A/B guard compares latency quantiles between arms with confidence
sequences on *ranks* (:mod:`tailguard.streams.sequential`), which need the
count of values below any threshold — a cumulative histogram. Buckets grow
geometrically, as in DDSketch (Masson, Rim & Lee, "DDSketch: a fast and
fully-mergeable quantile sketch with relative-error guarantees", VLDB 2019)::

    γ = (1 + r) / (1 − r)  with r = RELATIVE_ACCURACY = 0.5 %      (γ ≈ 1.01005)
    bucket i holds the values x with γ^(i−1) < x ≤ γ^i,  i = ⌈log_γ x⌉
    values ≤ MIN_VALUE fall in the first bucket, values > MAX_VALUE in the last

Counts are exact integers, so merging is addition (associative, order-free)
and the state of an arm does not depend on how its events were batched — a
replay gives the same bytes. Any quantile read from the buckets is within
``r`` of a value that lies in the same bucket, and a bound read from bucket
*edges* is conservative: the lower edge of the bucket holding the k-th
smallest value is ≤ that value, the upper edge ≥ it.

Only the span between the lowest and highest non-empty bucket is stored
(``lo`` and a dense ``uint32`` count array): a TTFT histogram from 50 ms to
5 s is ~460 buckets, 1.8 KB.
"""

import math
from collections.abc import Sequence

import numpy as np
from tailguard.streams.errors import CorruptStateError

__all__ = [
    "GAMMA",
    "MAX_INDEX",
    "MAX_VALUE",
    "MIN_INDEX",
    "MIN_VALUE",
    "RELATIVE_ACCURACY",
    "LogHist",
    "bucket_index",
    "lower_edge",
    "upper_edge",
]

RELATIVE_ACCURACY = 0.005
GAMMA = (1.0 + RELATIVE_ACCURACY) / (1.0 - RELATIVE_ACCURACY)
_LOG_GAMMA = math.log(GAMMA)
#: Smallest value told apart (ms); smaller ones share the first bucket.
MIN_VALUE = 1e-3
#: Largest value told apart (ms, ~28 h); larger ones share the last bucket.
MAX_VALUE = 1e8
MIN_INDEX = math.ceil(math.log(MIN_VALUE) / _LOG_GAMMA)
MAX_INDEX = math.ceil(math.log(MAX_VALUE) / _LOG_GAMMA)


def bucket_index(values: np.ndarray | Sequence[float]) -> np.ndarray:
    """``⌈log_γ x⌉`` of each value, clamped to ``[MIN_INDEX, MAX_INDEX]`` (int64)."""
    x = np.asarray(values, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        idx = np.ceil(np.log(np.maximum(x, MIN_VALUE)) / _LOG_GAMMA)
    idx = np.nan_to_num(idx, nan=float(MIN_INDEX))
    return np.clip(idx, MIN_INDEX, MAX_INDEX).astype(np.int64)


def lower_edge(index: np.ndarray | int) -> np.ndarray:
    """Exclusive lower edge ``γ^(i−1)`` of bucket ``i`` (0 for the first bucket)."""
    i = np.asarray(index, dtype=np.float64)
    return np.where(i <= MIN_INDEX, 0.0, np.exp((i - 1.0) * _LOG_GAMMA))


def upper_edge(index: np.ndarray | int) -> np.ndarray:
    """Inclusive upper edge ``γ^i`` of bucket ``i`` (+inf for the last bucket)."""
    i = np.asarray(index, dtype=np.float64)
    return np.where(i >= MAX_INDEX, np.inf, np.exp(i * _LOG_GAMMA))


class LogHist:
    """Counts of values per log bucket, stored densely from bucket ``lo`` on."""

    __slots__ = ("counts", "lo")

    def __init__(self, lo: int = 0, counts: np.ndarray | None = None) -> None:
        self.lo = int(lo)
        self.counts = np.zeros(0, dtype=np.int64) if counts is None else counts.astype(np.int64)

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    @property
    def hi(self) -> int:
        """One past the last stored bucket."""
        return self.lo + int(self.counts.size)

    def add(self, values: np.ndarray | Sequence[float], weights: np.ndarray | None = None) -> None:
        """Count ``values`` (one numpy pass); ``weights``: integer count of each value."""
        idx = bucket_index(values)
        if idx.size:
            self.add_indices(idx, weights)

    def add_indices(self, idx: np.ndarray, weights: np.ndarray | None = None) -> None:
        lo, hi = int(idx.min()), int(idx.max()) + 1
        self._span(lo, hi)
        counts = np.bincount(idx - self.lo, weights=weights, minlength=self.counts.size)
        self.counts += np.rint(counts[: self.counts.size]).astype(np.int64)

    def _span(self, lo: int, hi: int) -> None:
        if not self.counts.size:
            self.lo = lo
            self.counts = np.zeros(hi - lo, dtype=np.int64)
            return
        new_lo, new_hi = min(lo, self.lo), max(hi, self.hi)
        if new_lo == self.lo and new_hi == self.hi:
            return
        grown = np.zeros(new_hi - new_lo, dtype=np.int64)
        grown[self.lo - new_lo : self.lo - new_lo + self.counts.size] = self.counts
        self.lo, self.counts = new_lo, grown

    def merge(self, other: "LogHist") -> None:
        """Add ``other``'s counts to this histogram."""
        if not other.counts.size:
            return
        self._span(other.lo, other.hi)
        start = other.lo - self.lo
        self.counts[start : start + other.counts.size] += other.counts

    def copy(self) -> "LogHist":
        return LogHist(self.lo, self.counts.copy())

    def quantile(self, q: float) -> float | None:
        """The geometric middle of the bucket holding the ``⌈q·n⌉``-th smallest value
        (within ``RELATIVE_ACCURACY`` of it); None when empty."""
        n = self.n
        if n == 0:
            return None
        rank = max(1, math.ceil(q * n))
        j = int(np.searchsorted(np.cumsum(self.counts), rank))
        i = self.lo + j
        if i <= MIN_INDEX:
            return 0.0
        return float(2.0 * math.exp(i * _LOG_GAMMA) / (1.0 + GAMMA))

    def dense(self, lo: int, hi: int) -> np.ndarray:
        """Counts of buckets ``lo … hi−1`` (values outside are piled on the ends)."""
        out = np.zeros(hi - lo, dtype=np.int64)
        if not self.counts.size:
            return out
        idx = np.clip(np.arange(self.lo, self.hi), lo, hi - 1) - lo
        np.add.at(out, idx, self.counts)
        return out

    # -- bytes ------------------------------------------------------------
    def to_wire(self) -> tuple[int, bytes]:
        """``(lo, uint32 little-endian counts)`` trimmed to the non-empty span."""
        if not self.counts.size or not self.counts.any():
            return (0, b"")
        nz = np.flatnonzero(self.counts)
        first, last = int(nz[0]), int(nz[-1]) + 1
        if int(self.counts.max()) > 0xFFFFFFFF:
            msg = "a histogram bucket overflowed 2**32 counts"
            raise OverflowError(msg)
        return (self.lo + first, self.counts[first:last].astype("<u4").tobytes())

    @classmethod
    def from_wire(cls, wire: tuple[int, bytes] | list[object]) -> "LogHist":
        lo, raw = wire[0], wire[1]
        if not isinstance(lo, int) or not isinstance(raw, bytes) or len(raw) % 4:
            msg = "histogram wire must be (int, bytes of uint32)"
            raise CorruptStateError(msg)
        return cls(lo, np.frombuffer(raw, dtype="<u4").astype(np.int64))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LogHist):
            return NotImplemented
        return self.to_wire() == other.to_wire()

    def __repr__(self) -> str:
        return f"LogHist(n={self.n}, lo={self.lo}, buckets={self.counts.size})"
