"""The exact counts of a bucket: requests, errors, SLI tallies, and per cause flag.

Integers, so any merge order gives the same sums; a window's counters are the
sum of its buckets' (:func:`~tailguard.streams.bucket.sum_counters`).
"""

from dataclasses import dataclass
from operator import attrgetter

from tailguard.streams.attribution import FACTORS

__all__ = ["Counters"]

_FACTOR_FIELDS = [
    (f"f{i}_n", f"f{i}_bad", f"f{i}_ttft_n", f"f{i}_ttft_us") for i in range(len(FACTORS))
]
#: The four counts of each cause flag, read at once.
_FACTOR_ROWS = [attrgetter(*names) for names in _FACTOR_FIELDS]


@dataclass(slots=True)
class Counters:
    """Exact per-bucket counts. ``requests`` excludes warm-up requests.

    Besides the SLI counts: ``ttft_sum_us`` (TTFT sum, integer µs, so sums
    are exact under any merge order) and, per cause flag ``i`` of
    :data:`~tailguard.streams.attribution.FACTORS` over the ok requests,
    ``fi_n`` (with the flag), ``fi_bad`` (with it and violating a latency
    SLO), ``fi_ttft_n``/``fi_ttft_us`` (their TTFT count and sum). New
    fields go at the end: state written before they existed restores with 0.
    """

    requests: int = 0
    errors: int = 0
    cancelled: int = 0
    warmup: int = 0
    ttft_total: int = 0
    ttft_good: int = 0
    itl_total: int = 0
    itl_good: int = 0
    e2e_total: int = 0
    e2e_good: int = 0
    good_requests: int = 0
    ttft_sum_us: int = 0
    f0_n: int = 0
    f0_bad: int = 0
    f0_ttft_n: int = 0
    f0_ttft_us: int = 0
    f1_n: int = 0
    f1_bad: int = 0
    f1_ttft_n: int = 0
    f1_ttft_us: int = 0
    f2_n: int = 0
    f2_bad: int = 0
    f2_ttft_n: int = 0
    f2_ttft_us: int = 0

    def add(self, other: "Counters") -> None:
        # Unrolled: this runs for every bucket of every window merge.
        self.requests += other.requests
        self.errors += other.errors
        self.cancelled += other.cancelled
        self.warmup += other.warmup
        self.ttft_total += other.ttft_total
        self.ttft_good += other.ttft_good
        self.itl_total += other.itl_total
        self.itl_good += other.itl_good
        self.e2e_total += other.e2e_total
        self.e2e_good += other.e2e_good
        self.good_requests += other.good_requests
        self.ttft_sum_us += other.ttft_sum_us
        self.f0_n += other.f0_n
        self.f0_bad += other.f0_bad
        self.f0_ttft_n += other.f0_ttft_n
        self.f0_ttft_us += other.f0_ttft_us
        self.f1_n += other.f1_n
        self.f1_bad += other.f1_bad
        self.f1_ttft_n += other.f1_ttft_n
        self.f1_ttft_us += other.f1_ttft_us
        self.f2_n += other.f2_n
        self.f2_bad += other.f2_bad
        self.f2_ttft_n += other.f2_ttft_n
        self.f2_ttft_us += other.f2_ttft_us

    def add_list(self, values: list[int]) -> None:
        """Add counts given in field order (see :meth:`as_list`)."""
        (
            v0,
            v1,
            v2,
            v3,
            v4,
            v5,
            v6,
            v7,
            v8,
            v9,
            v10,
            v11,
            v12,
            v13,
            v14,
            v15,
            v16,
            v17,
            v18,
            v19,
            v20,
            v21,
            v22,
            v23,
        ) = values
        self.requests += v0
        self.errors += v1
        self.cancelled += v2
        self.warmup += v3
        self.ttft_total += v4
        self.ttft_good += v5
        self.itl_total += v6
        self.itl_good += v7
        self.e2e_total += v8
        self.e2e_good += v9
        self.good_requests += v10
        self.ttft_sum_us += v11
        self.f0_n += v12
        self.f0_bad += v13
        self.f0_ttft_n += v14
        self.f0_ttft_us += v15
        self.f1_n += v16
        self.f1_bad += v17
        self.f1_ttft_n += v18
        self.f1_ttft_us += v19
        self.f2_n += v20
        self.f2_bad += v21
        self.f2_ttft_n += v22
        self.f2_ttft_us += v23

    def as_list(self) -> list[int]:
        return list(_ALL(self))

    @classmethod
    def from_list(cls, values: list[int]) -> "Counters":
        return cls(*values)

    def add_factor(self, i: int, n: int, bad: int, ttft_n: int, ttft_us: int) -> None:
        """Add counts of cause flag ``i`` (see :meth:`factor_row`)."""
        names = _FACTOR_FIELDS[i]
        values = (n, bad, ttft_n, ttft_us)
        for name, value in zip(names, values, strict=True):
            setattr(self, name, getattr(self, name) + value)

    def factor_row(self, i: int) -> tuple[int, int, int, int]:
        """``(n, bad, ttft_n, ttft_us)`` of cause flag ``i``."""
        row: tuple[int, int, int, int] = _FACTOR_ROWS[i](self)
        return row


#: Every count in field order (what :meth:`Counters.as_list` gives).
_ALL = attrgetter(*Counters.__slots__)
