"""What folded batches owe their buckets, put in for many batches and buckets at once.

:func:`~tailguard.streams.fold.fold_many` computes every bucket's counters,
digest inputs and exemplar candidates of a batch in one numpy pass. Putting
them into each bucket (the counters, four ``Sketch.add`` calls, exemplars)
is per-bucket Python, the fold's largest part once a series has only a few
requests a batch. So a batch is kept as a :class:`FoldBatch` in a
:class:`Ledger`, and the ledger is settled when a read needs a bucket it owes
values: a window holding an owed open minute, a minute that closes while owed,
a checkpoint. Then each bucket gets one counters update and one ``Sketch.add``
per metric for all the batches since, the values grouped by bucket with one
stable sort.

Settling gives the bytes the batch-by-batch fold gives: counters add up, a
sketch's digest does not depend on how its values were batched
(:class:`~tailguard.streams.digest.Sketch`), exemplars keep the slowest of
all candidates, and prompt tallies and stage digests (rare) are put in batch
by batch, in order.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tailguard.streams.bucket import EXEMPLARS, Bucket, add_stage
from tailguard.streams.digest import Sketch

__all__ = ["MAX_HELD_EVENTS", "FoldBatch", "Ledger"]

#: Events a ledger holds before it settles by itself (its batches' arrays are
#: memory the buckets will hold once settled; this bounds the two together).
MAX_HELD_EVENTS = 500_000


@dataclass(slots=True, eq=False)
class FoldBatch:
    """The results of one batch's fold, row ``r`` for bucket ``buckets[r]``."""

    buckets: list[Bucket]
    #: Counter deltas, one row per bucket in :class:`Counters` field order.
    counts: np.ndarray
    #: Per latency metric: its name, its values, and the row each belongs to
    #: (rows ascending; a row's values in input order).
    metrics: list[tuple[str, np.ndarray, np.ndarray]]
    #: Per stage: its name, and each row's values (``values[off[r]:off[r + 1]]``).
    stages: list[tuple[str, np.ndarray, list[int]]]
    #: Exemplar candidates: row, E2E and trace id of each.
    exemplar_rows: np.ndarray
    exemplar_e2e: np.ndarray
    exemplar_traces: np.ndarray  # object: trace ids
    #: ``(prompt, requests, bad, exemplars)`` per row with any.
    prompts: dict[int, list[tuple[str, int, int, list[tuple[float, str]]]]]
    events: int
    max_centroids: int


class Ledger:
    """Batches folded since their buckets were last read (see the module docstring)."""

    __slots__ = ("_batches", "_events", "_generation")

    def __init__(self) -> None:
        self._batches: list[FoldBatch] = []
        self._events = 0
        #: Settles so far: a bucket marked with the current one is owed values.
        self._generation = 0

    def __bool__(self) -> bool:
        return bool(self._batches)

    @property
    def events(self) -> int:
        """Events held (folded since the last settle)."""
        return self._events

    def add(self, batch: FoldBatch) -> None:
        for bucket in batch.buckets:
            bucket.owed = self._generation
        self._batches.append(batch)
        self._events += batch.events
        if self._events >= MAX_HELD_EVENTS:
            self.settle()

    def owes(self, bucket: Bucket) -> bool:
        """Whether a batch held here has values for ``bucket``. Only open buckets can
        be owed: a batch folds into open minutes (late requests and replays take
        other paths), and a minute's bucket is settled before it closes."""
        return bucket.owed == self._generation and bool(self._batches)

    def settle_for(self, minutes: Sequence[Bucket]) -> None:
        """Settle if a batch held here owes one of ``minutes`` (a series' minute
        buckets in time order) values. Open minutes are the newest, and only they
        can be owed (:meth:`owes`): the search stops at the first closed one."""
        for bucket in reversed(minutes):
            if bucket.ids is None:
                return
            if self.owes(bucket):
                self.settle()
                return

    def settle(self) -> None:
        """Put into every bucket what the batches owe it, oldest batch first."""
        batches, self._batches, self._events = self._batches, [], 0
        if not batches:
            return
        self._generation += 1
        owners: list[Bucket] = []
        where: dict[int, int] = {}
        rows_of: list[np.ndarray] = []
        for batch in batches:
            rows = []
            for bucket in batch.buckets:
                at = where.get(id(bucket))
                if at is None:
                    at = where[id(bucket)] = len(owners)
                    owners.append(bucket)
                rows.append(at)
            rows_of.append(np.array(rows, dtype=np.int64))
        _prompts_and_stages(batches, owners, rows_of)
        _counts(batches, owners, rows_of)
        _metrics(batches, owners, rows_of)
        _exemplars(batches, owners, rows_of)


def _prompts_and_stages(
    batches: list[FoldBatch], owners: list[Bucket], rows_of: list[np.ndarray]
) -> None:
    """Prompt tallies and stage digests batch by batch (which prompts and stages a
    bucket keeps depends on the order they came in)."""
    for batch, rows in zip(batches, rows_of, strict=True):
        if batch.prompts:
            for row, tallies in batch.prompts.items():
                bucket = owners[rows[row]]
                for name, n, n_bad, found in tallies:
                    bucket.add_prompt(name, n, n_bad, found)
        for name, values, off in batch.stages:
            for row, bucket in enumerate(batch.buckets):
                lo, hi = off[row], off[row + 1]
                if hi > lo:
                    add_stage(bucket, name, values[lo:hi], batch.max_centroids)


def _counts(batches: list[FoldBatch], owners: list[Bucket], rows_of: list[np.ndarray]) -> None:
    if len(batches) == 1:
        total = batches[0].counts
    else:
        total = np.zeros((len(owners), batches[0].counts.shape[1]), dtype=np.int64)
        for batch, rows in zip(batches, rows_of, strict=True):
            total[rows] += batch.counts  # a bucket has one row a batch
    for bucket, row in zip(owners, total.tolist(), strict=True):
        bucket.add_counts(row)


def _metrics(batches: list[FoldBatch], owners: list[Bucket], rows_of: list[np.ndarray]) -> None:
    """One ``Sketch.add`` per bucket and metric: values grouped by bucket, batch order kept."""
    names = list(dict.fromkeys(name for batch in batches for name, _, _ in batch.metrics))
    max_centroids = batches[0].max_centroids
    for name in names:
        parts = [
            (values, rows[of_row])
            for batch, rows in zip(batches, rows_of, strict=True)
            for metric, values, of_row in batch.metrics
            if metric == name
        ]
        values, ends = _grouped(parts, len(owners))
        lo = 0
        for at, hi in enumerate(ends.tolist()):
            if hi > lo:
                digests = owners[at].digests
                sketch = digests.get(name)
                if sketch is None:
                    sketch = digests[name] = Sketch(max_centroids)
                sketch.add(values[lo:hi])
            lo = hi


def _grouped(parts: list[tuple[np.ndarray, np.ndarray]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The values of ``parts`` (``(values, owner)``, each owner's values contiguous
    in a part) grouped by owner, each owner's in part order, and where each
    owner's end.

    A merge of already grouped parts by arithmetic: each value's place is its
    owner's start, what earlier parts gave that owner, and its rank in its run.
    """
    if len(parts) == 1:
        values, owner = parts[0]
        if bool((owner[1:] >= owner[:-1]).all()):  # grouped in owner order already
            return values, np.cumsum(np.bincount(owner, minlength=n))
    counts = [np.bincount(owner, minlength=n) for _, owner in parts]
    ends = np.cumsum(np.add.reduce(counts))
    before = ends - np.add.reduce(counts)  # each owner's start
    out = np.empty(int(ends[-1]) if n else 0, dtype=np.float64)
    for (values, owner), count in zip(parts, counts, strict=True):
        at = np.arange(owner.size)
        head = np.r_[True, owner[1:] != owner[:-1]]
        rank = at - np.maximum.accumulate(np.where(head, at, 0))
        out[before[owner] + rank] = values
        before += count
    return out, ends


def _exemplars(batches: list[FoldBatch], owners: list[Bucket], rows_of: list[np.ndarray]) -> None:
    """Each bucket keeps the EXEMPLARS slowest of what it kept and every candidate."""
    owner = np.concatenate(
        [rows[b.exemplar_rows] for b, rows in zip(batches, rows_of, strict=True)]
    )
    if not owner.size:
        return
    e2e = np.concatenate([b.exemplar_e2e for b in batches])
    traces = np.concatenate([b.exemplar_traces for b in batches])
    # Per bucket, only the candidates that can make its top EXEMPLARS (ties included).
    order = np.lexsort((-e2e, owner))
    owner, e2e = owner[order], e2e[order]
    first = np.r_[0, np.flatnonzero(owner[1:] != owner[:-1]) + 1]
    sizes = np.diff(np.r_[first, owner.size])
    rank = np.arange(owner.size) - np.repeat(first, sizes)
    kth = np.repeat(e2e[np.minimum(first + EXEMPLARS - 1, first + sizes - 1)], sizes)
    chosen = np.flatnonzero((rank < EXEMPLARS) | (e2e >= kth))
    owner = owner[chosen]
    traced = traces[order[chosen]].tolist()
    found = list(zip(e2e[chosen].tolist(), traced, strict=True))
    edges = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1], True]).tolist()
    starts, ends = edges[:-1], edges[1:]
    for at, lo, hi in zip(owner[starts].tolist(), starts, ends, strict=True):
        owners[at].merge_exemplars(found[lo:hi])
