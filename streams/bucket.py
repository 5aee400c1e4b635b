"""One event-time bucket of one series: exact counters, latency digests, exemplars.

A bucket is a pure reducer in the quix/bytewax sense::

    Bucket.empty(start)          initialise
    bucket.absorb(cols, index)   agg(old, new): fold a batch of requests in (columns)
    bucket.merge(other)          combine two buckets (windows are merges)
    bucket.to_bytes() / Bucket.from_bytes(b)   snapshot / restore

Counters are integers and therefore exact under any merge order; digests are
t-digests whose merge is associative up to the digest's stated error.
"""

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
from tailguard.streams.attribution import FACTORS, MAX_STAGES, STAGE_PREFIX
from tailguard.streams.columns import ERROR_CODES, Columns
from tailguard.streams.counters import Counters
from tailguard.streams.digest import DEFAULT_MAX_CENTROIDS, EXACT_LIMIT, Sketch
from tailguard.streams.errors import CorruptStateError
from tailguard.streams.prompt_tally import (
    MAX_PROMPTS,
    OTHER_PROMPT,
    PROMPT_EXEMPLARS,
    PromptTally,
    prompt_rows,
)
from tailguard.streams.sli import Thresholds

__all__ = [
    "EXEMPLARS",
    "METRICS",
    "Bucket",
    "add_stage",
    "stage_order",
    "sum_counters",
]

#: The latency metrics every bucket keeps a digest of.
METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
#: How many slow-request exemplars (trace ids) a bucket keeps.
EXEMPLARS = 5
_ERROR_LO, _ERROR_HI = min(ERROR_CODES), max(ERROR_CODES)
_EMPTY = np.empty(0, dtype=np.float64)


def stage_order(names: list[str]) -> list[int]:
    """Column indexes of ``names`` in name order (the order stages join a bucket)."""
    return sorted(range(len(names)), key=names.__getitem__)


def _tally_prompts(bucket: "Bucket", cols: Columns, rows: np.ndarray, bad: np.ndarray) -> None:
    """Count the requests ``rows`` (``bad``: mask over them) per prompt version."""
    groups = np.zeros(rows.size, dtype=np.int64)
    for name, n, n_bad, found in prompt_rows(cols, rows, groups, bad).get(0, ()):
        bucket.add_prompt(name, n, n_bad, found)


def add_stage(bucket: "Bucket", name: str, values: np.ndarray, max_centroids: int) -> None:
    """Add one stage's values; a bucket keeps at most MAX_STAGES stages."""
    sketch = bucket.digests.get(name)
    if sketch is None:
        stages = sum(1 for key in bucket.digests if key.startswith(STAGE_PREFIX))
        if stages >= MAX_STAGES:
            return
        sketch = bucket.digests[name] = Sketch(max_centroids)
    sketch.add(values)


def sum_counters(parts: Sequence["Bucket"]) -> Counters:
    """The counters of ``parts`` added up (one numpy sum over their rows)."""
    if not parts:
        return Counters()
    if len(parts) == 1:
        return Counters.from_list(parts[0].counters.as_list())
    total = np.add.reduce([part.counter_row() for part in parts])
    return Counters.from_list(total.tolist())


class _Wire(msgspec.Struct, array_like=True):
    start_ms: int
    counters: list[int]
    digests: dict[str, bytes]
    ids: bytes | None
    exemplars: list[tuple[float, str]]
    applied: dict[int, int] = {}
    prompts: dict[str, tuple[int, int, list[tuple[float, str]]]] = {}
    #: Version of this record (0 outside the store; see :mod:`~tailguard.streams.bucket_log`).
    version: int = 0


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
    #: Requests per prompt version (see :class:`PromptTally`).
    prompts: dict[str, PromptTally] = field(default_factory=dict)
    #: Restored empty because its record was lost: the series takes the
    #: request-by-request replay path until the replay refilled it (never stored).
    refill: bool = False
    #: :meth:`counter_row`, kept once the bucket is closed (its counts no longer change).
    _row: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)
    #: How the bucket is stored (:mod:`~tailguard.streams.bucket_log`): the version of
    #: its last record and of its last whole record (0: never stored) ...
    version: int = field(default=0, repr=False, compare=False)
    base: int = field(default=0, repr=False, compare=False)
    #: ... each sketch's :meth:`Sketch.mark` then, and the event-id hashes added
    #: since (None: its next record is whole).
    marks: dict[str, tuple[int, int]] | None = field(default=None, repr=False, compare=False)
    new_ids: list[int] | None = field(default=None, repr=False, compare=False)
    #: The settle of its ledger at which a folded batch last gave it values
    #: (:meth:`~tailguard.streams.fold_batch.Ledger.owes`; −1: never).
    owed: int = field(default=-1, repr=False, compare=False)

    @classmethod
    def empty(cls, start_ms: int) -> "Bucket":
        return cls(start_ms=start_ms)

    def absorb(
        self,
        cols: Columns,
        index: np.ndarray,
        max_centroids: int,
        thresholds: Thresholds,
    ) -> None:
        """Fold the requests ``cols[index]`` in, column-wise (see :mod:`~tailguard.streams.sli`).

        One digest update per metric whatever the number of requests; counters
        are exact. ``index`` must be increasing (input order).
        """
        self._row = None
        c = self.counters
        warm = cols.warmup[index]
        n_warm = int(np.count_nonzero(warm))
        if n_warm:
            c.warmup += n_warm
            index = index[~warm]
        n = int(index.size)
        if n == 0:
            return
        c.requests += n
        status = cols.status[index]
        ok_mask = status == 0
        n_ok = int(np.count_nonzero(ok_mask))
        if n_ok < n:
            n_err = int(np.count_nonzero((status >= _ERROR_LO) & (status <= _ERROR_HI)))
            c.errors += n_err
            c.cancelled += n - n_ok - n_err
        if n_ok == 0:
            if cols.prompt_names:
                _tally_prompts(self, cols, index, (status >= _ERROR_LO) & (status <= _ERROR_HI))
            return
        ok = index[ok_mask] if n_ok < n else index
        e2e = cols.e2e[ok]
        good = np.ones(n_ok, dtype=np.bool_)
        if thresholds.e2e_ms is not None:
            within = e2e <= thresholds.e2e_ms
            c.e2e_total += n_ok
            c.e2e_good += int(np.count_nonzero(within))
            good &= within
        ttft = cols.ttft[ok]
        has_ttft = ~np.isnan(ttft)
        ttft_values = ttft[has_ttft]
        ttft_us = np.zeros(n_ok, dtype=np.int64)
        ttft_us[has_ttft] = np.rint(ttft_values * 1000.0).astype(np.int64)
        c.ttft_sum_us += int(ttft_us.sum())
        tpot_values = _EMPTY
        if ttft_values.size:
            within = ttft <= thresholds.ttft_ms  # NaN compares False
            c.ttft_total += int(ttft_values.size)
            c.ttft_good += int(np.count_nonzero(within))
            good &= within | ~has_ttft
            tokens = cols.tokens[ok]
            with_tpot = has_ttft & (tokens > 1)
            if with_tpot.any():
                tpot_values = (e2e[with_tpot] - ttft[with_tpot]) / (tokens[with_tpot] - 1)
                slow = np.flatnonzero(with_tpot)[tpot_values > thresholds.itl_ms]
                good[slow] = False
        gaps = _EMPTY
        if cols.itl.size:
            chosen = np.zeros(cols.ts.size, dtype=np.bool_)
            chosen[ok] = True
            gaps = cols.itl[chosen[cols.itl_owner]]
            c.itl_total += int(gaps.size)
            c.itl_good += int(np.count_nonzero(gaps <= thresholds.itl_ms))
        c.good_requests += int(np.count_nonzero(good))
        if cols.prompt_names:
            bad_rows = (status >= _ERROR_LO) & (status <= _ERROR_HI)
            bad_rows[np.flatnonzero(ok_mask)[~good]] = True
            _tally_prompts(self, cols, index, bad_rows)
        flags = cols.factors[ok]
        if flags.any():
            bad = ~good
            for i in range(len(FACTORS)):
                flagged = (flags & (1 << i)) != 0
                f_ttft = flagged & has_ttft
                c.add_factor(
                    i,
                    int(np.count_nonzero(flagged)),
                    int(np.count_nonzero(flagged & bad)),
                    int(np.count_nonzero(f_ttft)),
                    int(ttft_us[f_ttft].sum()),
                )
        for name, values in (
            ("ttft_ms", ttft_values),
            ("tpot_ms", tpot_values),
            ("itl_ms", gaps),
            ("e2e_ms", e2e),
        ):
            if values.size:
                sketch = self.digests.get(name)
                if sketch is None:
                    sketch = self.digests[name] = Sketch(max_centroids)
                sketch.add(values)
        for j in stage_order(cols.stage_names):
            column = cols.stages[ok, j]
            column = column[~np.isnan(column)]
            if column.size:
                add_stage(self, STAGE_PREFIX + cols.stage_names[j], column, max_centroids)
        traced = cols.has_trace[ok]
        if traced.any():
            slow_e2e = e2e[traced]
            rows = ok[traced]
            if slow_e2e.size > EXEMPLARS:
                # Only the requests that can make the top EXEMPLARS (ties included).
                kth = np.partition(slow_e2e, slow_e2e.size - EXEMPLARS)[slow_e2e.size - EXEMPLARS]
                keep = slow_e2e >= kth
                slow_e2e, rows = slow_e2e[keep], rows[keep]
            found = list(zip(slow_e2e.tolist(), cols.traces[rows].tolist(), strict=True))
            self.merge_exemplars(found)

    def merge_exemplars(self, found: list[tuple[float, str]]) -> None:
        """Keep the EXEMPLARS slowest of the current and ``found`` ``(e2e, trace)`` pairs."""
        kept = self.exemplars
        if len(kept) >= EXEMPLARS and max(found) <= kept[-1]:
            return  # nothing slower than what is kept (kept is sorted, slowest first)
        merged = kept + found
        merged.sort(reverse=True)
        del merged[EXEMPLARS:]
        self.exemplars = merged

    def add_prompt(
        self, name: str, requests: int, bad: int, exemplars: list[tuple[float, str]]
    ) -> None:
        """Add counts (and candidate exemplars) of one prompt version."""
        tally = self.prompts.get(name)
        if tally is None:
            if len(self.prompts) >= MAX_PROMPTS:
                name = OTHER_PROMPT
                tally = self.prompts.get(name)
            if tally is None:
                tally = self.prompts[name] = PromptTally()
        tally.requests += requests
        tally.bad += bad
        if exemplars:
            tally.exemplars = heapq.nlargest(PROMPT_EXEMPLARS, tally.exemplars + exemplars)

    def merge(self, other: "Bucket", max_centroids: int) -> None:
        """Fold another bucket in (used by windows and by the hourly roll-up)."""
        self._row = None
        self.counters.add(other.counters)
        for name, sketch in other.digests.items():
            mine = self.digests.get(name)
            if mine is None:
                mine = self.digests[name] = Sketch(max_centroids)
            mine.merge_inplace(sketch)
        if other.exemplars:
            self.exemplars = heapq.nlargest(EXEMPLARS, self.exemplars + other.exemplars)
        for name in sorted(other.prompts):
            t = other.prompts[name]
            self.add_prompt(name, t.requests, t.bad, t.exemplars)

    @classmethod
    def combine(
        cls, parts: "list[Bucket]", max_centroids: int, exact_up_to: int = EXACT_LIMIT
    ) -> "Bucket":
        """A new closed bucket holding all of ``parts`` (which are left untouched).

        ``exact_up_to``: see :meth:`Sketch.combine` (a window only read may stay
        exact longer than a bucket that is stored).

        Cheaper than folding with :meth:`merge` one part at a time: exact
        values are concatenated once and each digest is merged once.
        """
        out = cls(start_ms=0, ids=None, counters=sum_counters(parts))
        exemplars: list[tuple[float, str]] = []
        by_metric: dict[str, list[Sketch]] = {}
        for part in parts:
            exemplars.extend(part.exemplars)
            for name, sketch in part.digests.items():
                by_metric.setdefault(name, []).append(sketch)
            for name in sorted(part.prompts):
                t = part.prompts[name]
                out.add_prompt(name, t.requests, t.bad, t.exemplars)
        out.digests = {
            name: Sketch.combine(s, max_centroids, exact_up_to) for name, s in by_metric.items()
        }
        out.exemplars = heapq.nlargest(EXEMPLARS, exemplars)
        return out

    def add_counts(self, values: list[int]) -> None:
        """Add counts given in :class:`Counters` field order."""
        self._row = None
        self.counters.add_list(values)

    def counter_row(self) -> np.ndarray:
        """The counters as one int64 row, in :class:`Counters` field order."""
        row = self._row
        if row is None:
            row = np.array(self.counters.as_list(), dtype=np.int64)
            if self.ids is None and not self.refill:
                self._row = row
        return row

    def note_ids(self, hashes: list[int]) -> None:
        """``hashes`` joined :attr:`ids`: the bucket's next segment stores them."""
        if self.new_ids is not None:
            self.new_ids.extend(hashes)

    def close(self) -> None:
        """Forget the event ids: no event can join a closed bucket any more. Its
        digests fold their tails in, so a window of this bucket alone reads it
        as it is (:meth:`SeriesRing.window`)."""
        self.ids = None
        for sketch in self.digests.values():
            sketch.compact()

    @property
    def settled(self) -> bool:
        """Closed, and its digests hold their tails: a window of it alone is the
        bucket itself, read with no merge or copy."""
        return (
            self.ids is None and not self.refill and all(s.settled for s in self.digests.values())
        )

    def to_bytes(self, version: int = 0) -> bytes:
        """The bucket whole (``version``: of the stored record, see
        :mod:`~tailguard.streams.bucket_log`; 0 for the contents alone)."""
        ids = None
        if self.ids is not None:
            # Sorted: the bytes of a bucket depend on its contents only.
            ids = np.sort(np.fromiter(self.ids, dtype=np.uint64, count=len(self.ids))).tobytes()
        wire = _Wire(
            start_ms=self.start_ms,
            counters=self.counters.as_list(),
            digests={k: v.to_bytes() for k, v in sorted(self.digests.items())},
            ids=ids,
            exemplars=self.exemplars,
            applied=dict(sorted(self.applied.items())),  # bytes independent of fold order
            prompts={
                name: (t.requests, t.bad, t.exemplars) for name, t in sorted(self.prompts.items())
            },
            version=version,
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
            prompts={
                name: PromptTally(n, bad, [(float(e), str(t)) for e, t in ex])
                for name, (n, bad, ex) in wire.prompts.items()
            },
            version=wire.version,
            base=wire.version,
        )
