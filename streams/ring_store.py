"""How a series ring is stored: which bucket records a checkpoint writes, and restoring them.

A series is one small *meta* value (watermarks, the buckets it holds, input
offsets) plus its buckets' records: one whole record per bucket, keyed
``(tier, start)``, and for an open minute bucket the segments of what it gained
since, keyed ``(tier, start, version)`` (:mod:`~tailguard.streams.bucket_log`).
:class:`RingRecords` remembers which buckets changed and which records are no
longer needed; :meth:`RingRecords.take` encodes them for one checkpoint, and
:func:`restore_bucket` reads one bucket back, whole record then segments.

The checkpoint order that makes a restore consistent (records, then the meta,
then the deletes, each step delivered before the next) is the caller's:
``SeriesStore.checkpoint``.
"""

from collections.abc import Callable

from tailguard.streams.bucket import Bucket
from tailguard.streams.bucket_log import apply_segment, mark_stored, segment_bytes
from tailguard.streams.window_config import COARSE, FINE, Changes, RecordKey

__all__ = ["Load", "RingRecords", "chains", "restore_bucket"]

#: Reads one stored record (None: not in the store).
Load = Callable[[RecordKey], bytes | None]


def _segments(tier: str, start: int, bucket: Bucket, upto: int) -> list[RecordKey]:
    """Keys of ``bucket``'s segments on its current base, up to version ``upto``."""
    return [(tier, start, v) for v in range(bucket.base + 1, upto + 1)]


class RingRecords:
    """The records of a ring's buckets to write or delete at the next checkpoint."""

    __slots__ = ("_deleted", "_dirty")

    def __init__(self) -> None:
        self._dirty: set[tuple[str, int]] = set()
        self._deleted: set[RecordKey] = set()

    def touch(self, tier: str, start: int) -> None:
        """Bucket ``(tier, start)`` changed."""
        self._dirty.add((tier, start))
        self._deleted.discard((tier, start))

    def drop(self, tier: str, start: int, bucket: Bucket) -> None:
        """Bucket ``(tier, start)`` is gone: its whole record and its segments."""
        self._dirty.discard((tier, start))
        self._deleted.add((tier, start))
        self._deleted.update(_segments(tier, start, bucket, bucket.version))

    def rewrite(self, fine: dict[int, Bucket], coarse: dict[int, Bucket]) -> None:
        """Store every bucket whole at the next :meth:`take` (a checkpoint that took
        the changes was interrupted before storing them all)."""
        for tier, held in ((FINE, fine), (COARSE, coarse)):
            for start, bucket in held.items():
                bucket.marks = bucket.new_ids = None
                self._dirty.add((tier, start))

    def take(
        self, fine: dict[int, Bucket], coarse: dict[int, Bucket], meta: Callable[[], bytes]
    ) -> Changes:
        """The records of every bucket changed since the last call, the records no
        longer needed, and the meta (``meta()``, read once the records are taken:
        it lists each bucket's versions)."""
        upserts: dict[RecordKey, bytes] = {}
        deletes = set(self._deleted)
        for tier, start in sorted(self._dirty):
            bucket = (fine if tier == FINE else coarse)[start]
            version = bucket.version + 1
            segment = segment_bytes(bucket) if tier == FINE else None
            if segment is not None:
                upserts[(tier, start, version)] = segment
                mark_stored(bucket, version, whole=False)
                continue
            upserts[(tier, start)] = bucket.to_bytes(version)
            # The segments on the old base: delete them once the meta no longer lists them.
            deletes.update(_segments(tier, start, bucket, bucket.version))
            mark_stored(bucket, version, whole=True)
        changes = Changes(upserts=upserts, deletes=sorted(deletes), meta=meta())
        self._dirty.clear()
        self._deleted.clear()
        return changes


def chains(fine: dict[int, Bucket]) -> dict[int, tuple[int, int]]:
    """``start → (base, last version)`` of every minute bucket stored with segments."""
    return {s: (b.base, b.version) for s, b in sorted(fine.items()) if b.version > b.base}


def restore_bucket(
    tier: str, start: int, chain: tuple[int, int] | None, load: Load
) -> Bucket | None:
    """Bucket ``(tier, start)`` as the meta that lists it with ``chain`` (its base and
    last version; None: no segments) left it; None when its whole record is lost.

    Its whole record, then the segments on it in order, up to the meta's last
    or the first one missing or written on another base (a crash lost it): a
    bucket short of what the meta saw is an older bucket, whose input offsets
    make the replay add what it lacks, as with an older whole record. A whole
    record newer than ``chain``'s base holds everything the meta's segments
    would add (written later, its offsets make the replay skip what it holds).
    The bucket's next record is whole, numbered past every version the meta
    knows, and deletes the segments it leaves behind.
    """
    data = load((tier, start))
    if data is None:
        return None
    bucket = Bucket.from_bytes(data, key=(tier, start))
    if chain is None:
        return bucket
    base, last = chain
    if bucket.base == base:
        for version in range(base + 1, last + 1):
            segment = load((tier, start, version))
            key = (tier, start, version)
            if segment is None or not apply_segment(bucket, segment, version, key=key):
                break
    bucket.version = max(bucket.version, last)
    return bucket
