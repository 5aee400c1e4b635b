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
from dataclasses import dataclass

import msgspec
from tailguard.streams.bucket import Bucket
from tailguard.streams.bucket_log import apply_segment, mark_stored, segment_bytes
from tailguard.streams.errors import CorruptStateError
from tailguard.streams.window_config import COARSE, FINE, Changes, RecordKey

__all__ = [
    "Load",
    "RestoredTiers",
    "RingMeta",
    "RingRecords",
    "chains",
    "decode_meta",
    "restore_bucket",
    "restore_tiers",
]

#: Reads one stored record (None: not in the store).
Load = Callable[[RecordKey], bytes | None]


class RingMeta(msgspec.Struct, array_like=True):
    """A ring's meta value: its watermarks and tallies, and the buckets it holds."""

    watermark_ms: int | None
    late: int
    duplicates: int
    rolled_through_ms: int | None
    fine: list[int]
    coarse: list[int]
    counted: dict[int, int] = {}
    wm_before: list[tuple[int, int, int | None]] = []
    feeders: dict[int, int] = {}
    #: ``start → (base, last version)`` of minute buckets stored with segments.
    segments: dict[int, tuple[int, int]] = {}


def decode_meta(meta: bytes) -> RingMeta:
    try:
        return msgspec.msgpack.decode(meta, type=RingMeta)
    except msgspec.DecodeError as exc:
        msg = f"series meta state does not decode ({exc})"
        raise CorruptStateError(msg) from exc


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


@dataclass(slots=True)
class RestoredTiers:
    """A ring's buckets as :func:`restore_tiers` read them back."""

    fine: dict[int, Bucket]
    coarse: dict[int, Bucket]
    #: Whether a minute bucket came back empty, awaiting the replay of its input.
    refilling: bool
    #: Through where hours are rolled up (moved back before a lost hour).
    rolled_through_ms: int | None
    #: Highest input offset per partition any restored bucket had applied.
    applied: dict[int, int]


def restore_tiers(meta: RingMeta, load: Load) -> RestoredTiers:
    """Every bucket ``meta`` lists, read back (:func:`restore_bucket`). A minute
    bucket whose whole record is lost comes back empty, awaiting a refill, its
    next records numbered past the lost ones; a lost hour is rolled up again
    from its minute buckets."""
    out = RestoredTiers({}, {}, False, meta.rolled_through_ms, {})
    for tier, starts, store in ((FINE, meta.fine, out.fine), (COARSE, meta.coarse, out.coarse)):
        for start in starts:
            chain = meta.segments.get(start) if tier == FINE else None
            bucket = restore_bucket(tier, start, chain, load)
            if bucket is None:
                if tier == FINE:
                    version = chain[1] if chain else 0
                    store[start] = Bucket(start_ms=start, refill=True, version=version)
                    out.refilling = True
                elif out.rolled_through_ms is not None:
                    out.rolled_through_ms = min(out.rolled_through_ms, start)
                continue
            store[start] = bucket
            for p, o in bucket.applied.items():
                if o > out.applied.get(p, -1):
                    out.applied[p] = o
    return out
