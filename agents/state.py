"""Per-series window state: an in-memory cache in front of two RocksDB tables.

Layout (both tables are co-partitioned with ``tailguard.internal.series``)::

    tailguard-series   key = series key              value = SeriesWindows meta (watermark,
                                                             bucket list, applied offsets)
    tailguard-buckets  key = series key␟tier␟start   value = one Bucket, whole
                       key = …␟start␟version        value = a segment of what an open
                                                             bucket gained since

A checkpoint writes only the buckets that changed plus the small meta value,
and of an open bucket stored before only what it gained since (a segment), so
the changelog carries each value about once instead of a series' whole 3-day
history, or an open minute at every checkpoint (every table write is a
changelog record).

The cache holds live :class:`SeriesWindows` objects of the partitions this
worker owns; it is filled lazily from the tables (which faust restored from the
changelog) and dropped for partitions that are revoked.
"""

from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from tailguard.agents.bulk import BulkWriter, write_by_key
from tailguard.agents.outputs import OutputError
from tailguard.streams import Changes, RingConfig, SeriesWindows, Thresholds

__all__ = [
    "CachedSeries",
    "CheckpointInterrupted",
    "Checkpointed",
    "SeriesStore",
    "bucket_key",
]

_SEP = "\x1f"
#: GPUs a series remembers as having served it (the latest seen).
MAX_GPUS_PER_SERIES = 64


def bucket_key(series: str, tier: str, start: int, version: int | None = None) -> str:
    """Table key of one bucket record of one series: the bucket whole, or with
    ``version`` one of its segments (``*key`` of a :data:`RecordKey`)."""
    key = f"{series}{_SEP}{tier}{_SEP}{start}"
    return key if version is None else f"{key}{_SEP}{version}"


class CheckpointInterrupted(Exception):
    """The partition moved (or is moving) while a checkpoint waited for a flush:
    the rest was not written, and nothing may be acknowledged."""


@dataclass(slots=True)
class Checkpointed:
    """What :meth:`SeriesStore.checkpoint_many` did, per partition."""

    #: Records written, per partition stored whole (its input may be acknowledged
    #: once the caller's last flush has them delivered).
    written: dict[int, int] = field(default_factory=dict)
    #: Partitions that moved during the checkpoint (nothing may be acknowledged).
    moved: set[int] = field(default_factory=set)
    #: Partitions whose records the broker refused, and why (nothing may be
    #: acknowledged; their series are written whole at the next checkpoint).
    refused: dict[int, str] = field(default_factory=dict)

    def stored(self, partition: int) -> bool:
        return partition not in self.moved and partition not in self.refused


@dataclass(slots=True)
class _Taken:
    """The records of one partition a checkpoint writes, in its three steps."""

    buckets: list[tuple[str, bytes]] = field(default_factory=list)
    metas: list[tuple[str, bytes]] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)


@dataclass(slots=True)
class CachedSeries:
    """A live series state and the partition that owns it."""

    state: SeriesWindows
    partition: int
    #: GPUs that served the series: ``(host, gpu) → last seen (event time)``.
    gpus: dict[tuple[str, int], int] = field(default_factory=dict)

    def note_gpus(self, gpus: list[tuple[str, int, int]]) -> None:
        """Remember which GPUs served the series (``(host, gpu, event time)``, for
        the breach GPU join): the :data:`MAX_GPUS_PER_SERIES` seen last."""
        known = self.gpus
        for host, index, ts in gpus:
            if ts > known.get((host, index), 0):
                known[(host, index)] = ts
        if len(known) > MAX_GPUS_PER_SERIES:
            for gone in sorted(known, key=known.__getitem__)[: len(known) - MAX_GPUS_PER_SERIES]:
                del known[gone]


class SeriesStore:
    """Reads, caches and writes :class:`SeriesWindows` through two faust tables."""

    def __init__(
        self,
        meta_table: MutableMapping[str, bytes],
        bucket_table: MutableMapping[str, bytes],
        ring: RingConfig,
        thresholds: Callable[[str], Thresholds] | None = None,
        writer: BulkWriter | None = None,
    ) -> None:
        self._meta = meta_table
        #: Checkpoints write through it in bulk (None: key by key, as plain mappings).
        self.writer = writer
        self._buckets = bucket_table
        self._ring = ring
        self._thresholds = thresholds or (lambda _series: Thresholds())
        self._cache: dict[str, CachedSeries] = {}
        #: Series changed since their partition's last checkpoint, per partition.
        self._unsaved: dict[int, set[str]] = {}
        #: Series changed since their last provisional snapshot, oldest change first.
        self._changed: dict[str, None] = {}
        #: Set at start and after every rebalance: the next timer tick (once
        #: recovery is complete) loads every owned series from the tables.
        self.needs_warm = True

    def get(self, series: str, partition: int) -> CachedSeries:
        """The live state of ``series``; restored from the tables on first use.

        Must run inside an agent processing a message of ``partition``: faust
        reads and writes the partition's RocksDB store of the current event.
        """
        cached = self._cache.get(series)
        if cached is not None:
            return cached
        meta = self._meta.get(series)
        thresholds = self._thresholds(series)
        if meta is None:
            state = SeriesWindows(self._ring, thresholds)
        else:
            state = SeriesWindows.restore(
                meta,
                lambda key: self._buckets.get(bucket_key(series, *key)),
                self._ring,
                thresholds,
            )
            state.take_changes()  # what was just loaded is not a change
        cached = self._cache[series] = CachedSeries(state, partition)
        return cached

    def save(self, series: str, changes: Changes) -> None:
        """Write a batch's changes at once: touched buckets, the meta, deleted buckets.

        For tests and tools; a worker checkpoints with :meth:`checkpoint`, which
        puts the producer flushes that make a restore consistent in between.
        """
        for key, data in changes.upserts.items():
            self._buckets[bucket_key(series, *key)] = data
        self._meta[series] = changes.meta
        self._delete([bucket_key(series, *key) for key in changes.deletes])

    def _delete(self, keys: list[str]) -> None:
        for key in keys:
            if key in self._buckets:
                del self._buckets[key]

    def _write(
        self,
        table: Any,
        partition: int,
        puts: Sequence[tuple[str, bytes]],
        deletes: Sequence[str] = (),
    ) -> None:
        if self.writer is not None:
            self.writer.write(table, partition, puts, deletes)
        else:
            write_by_key(table, puts, deletes)

    def mark_unsaved(self, series: str, partition: int) -> None:
        """``series`` changed: write it at its partition's next :meth:`checkpoint`
        and show it in the next provisional snapshots (:meth:`next_changed`)."""
        self._unsaved.setdefault(partition, set()).add(series)
        self._changed[series] = None

    def next_changed(self) -> tuple[str, CachedSeries] | None:
        """The series changed longest ago and not shown since (forgotten here), or None.

        Costs one step per changed series, however many series are known."""
        while self._changed:
            key = next(iter(self._changed))
            del self._changed[key]
            cached = self._cache.get(key)
            if cached is not None:
                return key, cached
        return None

    def unsaved(self, partition: int) -> int:
        return len(self._unsaved.get(partition, ()))

    async def checkpoint(
        self,
        partition: int,
        flush: Callable[[], Awaitable[None]],
        still_mine: Callable[[], bool] = lambda: True,
    ) -> int:
        """:meth:`checkpoint_many` of one partition: the records written, or
        :class:`CheckpointInterrupted`."""
        done = await self.checkpoint_many([partition], flush, lambda _partition: still_mine())
        if partition in done.moved:
            raise CheckpointInterrupted(f"partition {partition} moved during its checkpoint")
        if partition in done.refused:
            msg = f"checkpoint of partition {partition} not delivered: {done.refused[partition]}"
            raise CheckpointInterrupted(msg)
        return done.written.get(partition, 0)

    async def checkpoint_many(
        self,
        partitions: Sequence[int],
        flush: Callable[[], Awaitable[None]],
        still_mine: Callable[[int], bool] = lambda _partition: True,
        within: Callable[[int], AbstractContextManager[None]] = lambda _partition: nullcontext(),
    ) -> "Checkpointed":
        """Write every changed series of ``partitions``.

        In three steps, with ``flush`` (every write so far is on the changelog:
        faust's producer's and the bulk writer's) between them, so that whatever a
        kill leaves in the local store and on the changelog restores to a
        consistent state (with a :class:`~tailguard.agents.bulk.BulkWriter`, each
        step writes a table's partition at once, RocksDB without its log, and
        queues its changelog records in bulk; the caller flushes once more before
        it acknowledges input):

        1. the touched buckets: a bucket ahead of its meta is harmless (its
           ``applied`` offsets make the replay skip what it holds);
        2. the metas: a meta on the changelog never lists a bucket version that
           is not (which the replay could not refill: its input may be committed);
        3. the buckets the metas no longer list: a meta that still lists one is
           never restored after it is gone.

        Each step covers every partition of the cut, so partitions cut together
        share their flushes (three broker round trips, not three a partition).

        ``within(partition)`` wraps the writes of a partition: faust writes a
        table key by key to the store and changelog partition of the current
        event (the bulk writer names the partition itself). The caller's writes
        made before it (breach states) are flushed in step 1.

        ``still_mine(partition)`` is asked after each flush: a partition revoked
        meanwhile (a rebalance) is written no further, since stale records could
        reach a changelog its next owner has already read; it is reported in
        :attr:`Checkpointed.moved`, and if it stays here its series are written
        whole at the next checkpoint. A flush that fails stops every partition
        of the step likewise (:attr:`Checkpointed.refused`).
        """
        return await self.write_taken(self.take_many(partitions), flush, still_mine, within)

    def take_many(self, partitions: Sequence[int]) -> dict[int, "_Taken"]:
        """The records of every changed series of ``partitions``, as they stand now
        (a series changed later is taken next time), for :meth:`write_taken`."""
        taken = {p: self._take(p) for p in partitions}
        return {p: t for p, t in taken.items() if t.metas}

    def untake(self, taken: dict[int, "_Taken"]) -> None:
        """``taken`` was not written: its series are written whole next time."""
        for partition, t in taken.items():
            self._redo(partition, [key for key, _ in t.metas])

    async def write_taken(
        self,
        taken: dict[int, "_Taken"],
        flush: Callable[[], Awaitable[None]],
        still_mine: Callable[[int], bool] = lambda _partition: True,
        within: Callable[[int], AbstractContextManager[None]] = lambda _partition: nullcontext(),
    ) -> "Checkpointed":
        """Write what :meth:`take_many` took, in the steps of :meth:`checkpoint_many`."""
        taken = dict(taken)
        done = Checkpointed()
        for partition, t in taken.items():
            with within(partition):
                self._write(self._buckets, partition, t.buckets)
        if not taken:
            return done
        await self._flush_step(flush, taken, done)
        self._keep_mine(taken, still_mine, done, redo=True)
        for partition, t in taken.items():
            with within(partition):
                self._write(self._meta, partition, t.metas)
            done.written[partition] = len(t.buckets) + len(t.metas) + len(t.pruned)
        pruning = {p: t for p, t in taken.items() if t.pruned}
        if pruning:
            await self._flush_step(flush, pruning, done)
            # Past here only deletes remain: a bucket not deleted is just garbage.
            self._keep_mine(pruning, still_mine, done, redo=False)
            for partition, t in pruning.items():
                with within(partition):
                    self._write(self._buckets, partition, [], t.pruned)
        return done

    def _take(self, partition: int) -> "_Taken":
        """The records of every series of ``partition`` changed since its last checkpoint."""
        out = _Taken()
        for key in sorted(self._unsaved.pop(partition, set())):
            cached = self._cache.get(key)
            if cached is None:
                continue
            changes = cached.state.take_changes()
            out.buckets.extend(
                (bucket_key(key, *record), data) for record, data in changes.upserts.items()
            )
            out.metas.append((key, changes.meta))
            out.pruned.extend(bucket_key(key, *record) for record in changes.deletes)
        return out

    async def _flush_step(
        self,
        flush: Callable[[], Awaitable[None]],
        taken: dict[int, "_Taken"],
        done: "Checkpointed",
    ) -> None:
        """``flush()``; when the broker refuses, every partition of the step is
        interrupted (and its series are written whole next time)."""
        try:
            await flush()
        except OutputError as exc:
            for partition, t in list(taken.items()):
                self._redo(partition, [key for key, _ in t.metas])
                done.refused[partition] = str(exc)
                done.written.pop(partition, None)
            taken.clear()

    def _redo(self, partition: int, keys: list[str]) -> None:
        for key in keys:
            cached = self._cache.get(key)
            if cached is not None:
                cached.state.rewrite_all()
                self.mark_unsaved(key, partition)

    def _keep_mine(
        self,
        taken: dict[int, "_Taken"],
        still_mine: Callable[[int], bool],
        done: "Checkpointed",
        *,
        redo: bool,
    ) -> None:
        """Drop from ``taken`` the partitions that moved (``redo``: their series are
        written whole if they stay here)."""
        for partition in [p for p in taken if not still_mine(p)]:
            t = taken.pop(partition)
            if redo:
                self._redo(partition, [key for key, _ in t.metas])
            done.moved.add(partition)
            done.written.pop(partition, None)

    def warm(self, partition_of: Callable[[str], int]) -> int:
        """Load every series of the partitions this worker owns (after start or a rebalance).

        Without it a restarted worker that has nothing new to consume would never
        publish its restored series again. Returns how many series were loaded.
        """
        loaded = 0
        for raw in list(self._meta.keys()):
            key = raw.decode() if isinstance(raw, bytes) else str(raw)
            if key not in self._cache:
                self.get(key, partition=partition_of(key))
                self._changed[key] = None
                loaded += 1
        self.needs_warm = False
        return loaded

    def forget_partitions(self, partitions: set[int]) -> int:
        """Drop cached series (and unwritten changes) of partitions that moved away."""
        gone = [k for k, v in self._cache.items() if v.partition in partitions]
        for key in gone:
            del self._cache[key]
        for partition in partitions:
            self._unsaved.pop(partition, None)
        return len(gone)

    def partitions(self) -> set[int]:
        """Partitions of the cached series."""
        return {v.partition for v in self._cache.values()}

    def items(self) -> list[tuple[str, CachedSeries]]:
        return list(self._cache.items())

    def __len__(self) -> int:
        return len(self._cache)
