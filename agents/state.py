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
from dataclasses import dataclass, field
from typing import Any

from tailguard.agents.bulk import BulkWriter, write_by_key
from tailguard.agents.outputs import OutputError
from tailguard.streams import Changes, RingConfig, SeriesWindows, Thresholds

__all__ = ["CachedSeries", "CheckpointInterrupted", "SeriesStore", "bucket_key"]

_SEP = "\x1f"


def bucket_key(series: str, tier: str, start: int, version: int | None = None) -> str:
    """Table key of one bucket record of one series: the bucket whole, or with
    ``version`` one of its segments (``*key`` of a :data:`RecordKey`)."""
    key = f"{series}{_SEP}{tier}{_SEP}{start}"
    return key if version is None else f"{key}{_SEP}{version}"


class CheckpointInterrupted(Exception):
    """The partition moved (or is moving) while a checkpoint waited for a flush:
    the rest was not written, and nothing may be acknowledged."""


@dataclass(slots=True)
class CachedSeries:
    """A live series state and the partition that owns it."""

    state: SeriesWindows
    partition: int
    #: GPUs that served the series: ``(host, gpu) → last seen (event time)``.
    gpus: dict[tuple[str, int], int] = field(default_factory=dict)


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
        """Write every changed series of ``partition``; returns how many records.

        In three steps, with ``flush`` (every write so far is on the changelog:
        faust's producer's and the bulk writer's) between them, so that whatever a
        kill leaves in the local store and on the changelog restores to a
        consistent state (with a :class:`~tailguard.agents.bulk.BulkWriter`, each
        step is one RocksDB write batch per table and its changelog records in
        bulk, and the caller flushes once more before it acknowledges input):

        1. the touched buckets: a bucket ahead of its meta is harmless (its
           ``applied`` offsets make the replay skip what it holds);
        2. the metas: a meta on the changelog never lists a bucket version that
           is not (which the replay could not refill: its input may be committed);
        3. the buckets the metas no longer list: a meta that still lists one is
           never restored after it is gone.

        Must run inside the agent while it processes a message of ``partition``
        (faust writes to the store and changelog partition of the current event);
        the caller's writes made before it (breach states) are flushed in step 1.
        A flush that fails raises :class:`CheckpointInterrupted` too.

        ``still_mine()`` is asked after each flush: if the partition was revoked
        meanwhile (a rebalance), writing on could put stale records on a changelog
        its next owner has already read, so :class:`CheckpointInterrupted` is
        raised instead, and the series are written whole at the next checkpoint
        if the partition stays here.
        """
        keys = self._unsaved.pop(partition, set())
        buckets: list[tuple[str, bytes]] = []
        metas: list[tuple[str, bytes]] = []
        pruned: list[str] = []
        for key in sorted(keys):
            cached = self._cache.get(key)
            if cached is None:
                continue
            changes = cached.state.take_changes()
            buckets.extend(
                (bucket_key(key, *record), data) for record, data in changes.upserts.items()
            )
            metas.append((key, changes.meta))
            pruned.extend(bucket_key(key, *record) for record in changes.deletes)
        if not metas:
            return 0
        written = [key for key, _ in metas]
        self._write(self._buckets, partition, buckets)
        await self._flush(flush, partition, written)
        self._go_on(partition, written, still_mine)
        self._write(self._meta, partition, metas)
        if pruned:
            await self._flush(flush, partition, written)
            # Past here only deletes remain: a bucket not deleted is just garbage.
            self._go_on(partition, [], still_mine)
            self._write(self._buckets, partition, [], pruned)
        return len(buckets) + len(metas) + len(pruned)

    async def _flush(
        self, flush: Callable[[], Awaitable[None]], partition: int, keys: list[str]
    ) -> None:
        """``flush()``; when the broker refuses, the series are written whole next time."""
        try:
            await flush()
        except OutputError as exc:
            self._redo(partition, keys)
            msg = f"checkpoint of partition {partition} not delivered: {exc}"
            raise CheckpointInterrupted(msg) from exc

    def _redo(self, partition: int, keys: list[str]) -> None:
        for key in keys:
            cached = self._cache.get(key)
            if cached is not None:
                cached.state.rewrite_all()
                self.mark_unsaved(key, partition)

    def _go_on(self, partition: int, keys: list[str], still_mine: Callable[[], bool]) -> None:
        if still_mine():
            return
        self._redo(partition, keys)
        raise CheckpointInterrupted(f"partition {partition} moved during its checkpoint")

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
