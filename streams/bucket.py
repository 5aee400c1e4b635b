"""One event-time bucket of one series: exact counters, latency digests, exemplars.

A bucket is a pure reducer in the quix/bytewax sense::

    Bucket.empty(start)          initialise
    bucket.absorb(accumulator)   agg(old, new): fold a batch of requests in
    bucket.merge(other)          combine two buckets (windows are merges)
    bucket.to_bytes() / Bucket.from_bytes(b)   snapshot / restore

Counters are integers and therefore exact under any merge order; digests are
t-digests whose merge is associative up to the digest's stated error.
"""

import hashlib
import heapq
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
from tailguard.streams.digest import DEFAULT_MAX_CENTROIDS, Sketch
from tailguard.streams.errors import CorruptStateError
from tailguard.streams.sli import Thresholds

__all__ = ["METRICS", "Accumulator", "Bucket", "Counters", "event_hash"]

#: The latency metrics every bucket keeps a digest of.
METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
#: How many slow-request exemplars (trace ids) a bucket keeps.
EXEMPLARS = 5
_ERROR_STATUSES = frozenset({"error", "timeout", "rejected"})


def event_hash(event_id: str) -> int:
    """A stable 64-bit hash of an event id (Python's ``hash`` changes per process)."""
    return int.from_bytes(hashlib.blake2b(event_id.encode(), digest_size=8).digest(), "little")


@dataclass(slots=True)
class Counters:
    """Exact per-bucket counts. ``requests`` excludes warm-up requests."""

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

    def as_list(self) -> list[int]:
        return [getattr(self, name) for name in self.__slots__]  # type: ignore[attr-defined]

    @classmethod
    def from_list(cls, values: list[int]) -> "Counters":
        return cls(*values)


@dataclass(slots=True)
class Accumulator:
    """Requests of one batch that fall into one bucket, gathered column-wise."""

    counters: Counters = field(default_factory=Counters)
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    exemplars: list[tuple[float, str]] = field(default_factory=list)

    def add(
        self,
        *,
        status: str,
        e2e_ms: float,
        ttft_ms: float | None,
        output_tokens: int | None,
        itl_ms: list[float] | None,
        trace_id: str | None,
        warmup: bool,
        thresholds: Thresholds,
    ) -> None:
        """Fold one request in (see :mod:`tailguard.streams.sli` for the definitions)."""
        c = self.counters
        if warmup:
            c.warmup += 1
            return
        c.requests += 1
        if status != "ok":
            if status in _ERROR_STATUSES:
                c.errors += 1
            else:
                c.cancelled += 1
            return
        good = True
        self.e2e.append(e2e_ms)
        if thresholds.e2e_ms is not None:
            c.e2e_total += 1
            if e2e_ms <= thresholds.e2e_ms:
                c.e2e_good += 1
            else:
                good = False
        if ttft_ms is not None:
            self.ttft.append(ttft_ms)
            c.ttft_total += 1
            if ttft_ms <= thresholds.ttft_ms:
                c.ttft_good += 1
            else:
                good = False
            if output_tokens is not None and output_tokens > 1:
                tpot = (e2e_ms - ttft_ms) / (output_tokens - 1)
                self.tpot.append(tpot)
                if tpot > thresholds.itl_ms:
                    good = False
        if itl_ms:
            # itl_total / itl_good are counted per batch with numpy in Bucket.absorb.
            self.itl.extend(itl_ms)
        if good:
            c.good_requests += 1
        if trace_id:
            self.exemplars.append((e2e_ms, trace_id))


class _Wire(msgspec.Struct, array_like=True):
    start_ms: int
    counters: list[int]
    digests: dict[str, bytes]
    ids: bytes | None
    exemplars: list[tuple[float, str]]
    applied: dict[int, int] = {}


@dataclass(slots=True)
class Bucket:
    """State of ``[start_ms, start_ms + width)`` for one series.

    ``ids`` holds the 64-bit hashes of the event ids seen while the bucket is
    open (duplicate suppression); it is dropped (``None``) once the bucket closes.
    ``applied`` makes re-delivery after a crash idempotent *per bucket*, so a
    restore in which some bucket records reached the changelog and others did
    not still converges to the uninterrupted result when the input is replayed.
    """

    start_ms: int
    counters: Counters = field(default_factory=Counters)
    digests: dict[str, Sketch] = field(default_factory=dict)
    ids: set[int] | None = field(default_factory=set)
    exemplars: list[tuple[float, str]] = field(default_factory=list)
    #: Highest input offset folded in, per input partition: replaying an input
    #: message whose events this bucket already holds is a no-op.
    applied: dict[int, int] = field(default_factory=dict)
    #: Restored empty because its record was lost: accepts replayed input even
    #: though the watermark says it is closed (never stored).
    refill: bool = False

    @classmethod
    def empty(cls, start_ms: int) -> "Bucket":
        return cls(start_ms=start_ms)

    def absorb(self, acc: Accumulator, max_centroids: int, itl_threshold_ms: float) -> None:
        """Fold an accumulator in: one digest merge per metric, whatever the batch size."""
        if acc.itl:
            gaps = np.asarray(acc.itl, dtype=np.float64)
            acc.counters.itl_total += int(gaps.size)
            acc.counters.itl_good += int(np.count_nonzero(gaps <= itl_threshold_ms))
        self.counters.add(acc.counters)
        for name, values in (
            ("ttft_ms", acc.ttft),
            ("tpot_ms", acc.tpot),
            ("itl_ms", acc.itl),
            ("e2e_ms", acc.e2e),
        ):
            if values:
                sketch = self.digests.get(name)
                if sketch is None:
                    sketch = self.digests[name] = Sketch(max_centroids)
                sketch.add(values)
        if acc.exemplars:
            self.exemplars = heapq.nlargest(EXEMPLARS, self.exemplars + acc.exemplars)

    def merge(self, other: "Bucket", max_centroids: int) -> None:
        """Fold another bucket in (used by windows and by the hourly roll-up)."""
        self.counters.add(other.counters)
        for name, sketch in other.digests.items():
            mine = self.digests.get(name)
            if mine is None:
                mine = self.digests[name] = Sketch(max_centroids)
            mine.merge_inplace(sketch)
        if other.exemplars:
            self.exemplars = heapq.nlargest(EXEMPLARS, self.exemplars + other.exemplars)

    @classmethod
    def combine(cls, parts: "list[Bucket]", max_centroids: int) -> "Bucket":
        """A new closed bucket holding all of ``parts`` (which are left untouched).

        Cheaper than folding with :meth:`merge` one part at a time: exact
        values are concatenated once and each digest is merged once.
        """
        out = cls(start_ms=0, ids=None)
        counters = out.counters
        exemplars: list[tuple[float, str]] = []
        by_metric: dict[str, list[Sketch]] = {}
        for part in parts:
            counters.add(part.counters)
            exemplars.extend(part.exemplars)
            for name, sketch in part.digests.items():
                by_metric.setdefault(name, []).append(sketch)
        out.digests = {name: Sketch.combine(s, max_centroids) for name, s in by_metric.items()}
        out.exemplars = heapq.nlargest(EXEMPLARS, exemplars)
        return out

    def close(self) -> None:
        """Forget the event ids: no event can join a closed bucket any more."""
        self.ids = None

    def to_bytes(self) -> bytes:
        ids = None
        if self.ids is not None:
            ids = np.fromiter(self.ids, dtype=np.uint64, count=len(self.ids)).tobytes()
        wire = _Wire(
            start_ms=self.start_ms,
            counters=self.counters.as_list(),
            digests={k: v.to_bytes() for k, v in self.digests.items()},
            ids=ids,
            exemplars=self.exemplars,
            applied=self.applied,
        )
        return msgspec.msgpack.encode(wire)

    @classmethod
    def from_bytes(cls, data: bytes, *, key: Any = None) -> "Bucket":
        try:
            wire = msgspec.msgpack.decode(data, type=_Wire)
            digests = {
                k: Sketch.from_bytes(v, DEFAULT_MAX_CENTROIDS) for k, v in wire.digests.items()
            }
            counters = Counters.from_list(wire.counters)
            ids = None
            if wire.ids is not None:
                ids = set(np.frombuffer(wire.ids, dtype=np.uint64).tolist())
        except (msgspec.DecodeError, ValueError, TypeError) as exc:
            msg = (
                f"bucket state {key!r} does not decode ({exc}); delete the worker data dir "
                "and let it restore from the changelog"
            )
            raise CorruptStateError(msg) from exc
        return cls(
            start_ms=wire.start_ms,
            counters=counters,
            digests=digests,
            ids=ids,
            exemplars=[(float(e), str(t)) for e, t in wire.exemplars],
            applied=dict(wire.applied),
        )
