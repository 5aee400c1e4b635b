"""A bucket in the store: one whole record, then segments of what it gained since.

An open minute bucket is stored at every checkpoint of its partition while it
fills. Stored whole each time, a bucket of a busy series was written again and
again: with a checkpoint every 5 s, each of a minute's values about a dozen
times, most of the checkpoint's bytes and time. A *segment* holds only what
the bucket gained since it was last stored:

- per sketch, the values added since, as raw float64 — while the sketch is
  exact, or while the chunks its digest merged since are no more values than
  a digest's bytes (the sketch keeps them from its last record on:
  :meth:`~tailguard.streams.digest.Sketch.since`); otherwise the sketch whole.
  A busy series' ITL digest merges a chunk every ~110 requests: storing it
  whole at every checkpoint that follows a merge made most of a sustained
  run's checkpoint bytes;
- the event-id hashes added since (:meth:`Bucket.note_ids`);
- its small parts whole: counters, exemplars, input offsets, prompt tallies.

Adding a segment's values to the bucket as it was gives the bucket as it is,
bytes for bytes (a sketch is the same however its values were batched).

Versions: each record a bucket stores, whole or segment, takes the next
version number. A whole record carries its own version (the *base*), a
segment its own and its base's. The series' meta lists, for each bucket with
segments, its base and last version
(:class:`~tailguard.streams.ring_store.RingRecords`); a restore reads the base
and the segments after it up to the last; a chain a crash broke gives the
bucket as it was before the gap, an older bucket the replay completes
(:func:`~tailguard.streams.ring_store.restore_bucket`). A bucket is stored whole when it
is new, once it closes (its ids go, its digests compact), after
:data:`MAX_SEGMENTS` segments, and whenever a checkpoint was interrupted.
"""

import msgspec
import numpy as np
from tailguard.streams.bucket import Bucket
from tailguard.streams.counters import Counters
from tailguard.streams.digest import DEFAULT_MAX_CENTROIDS, Sketch
from tailguard.streams.errors import CorruptStateError
from tailguard.streams.prompt_tally import PromptTally

__all__ = ["MAX_SEGMENTS", "apply_segment", "mark_stored", "segment_bytes"]

#: Segments on one base before the bucket is stored whole again (bounds what a
#: restore reads and applies for one bucket).
MAX_SEGMENTS = 16


class _Segment(msgspec.Struct, array_like=True):
    base: int
    version: int
    counters: list[int]
    added: dict[str, bytes]
    whole: dict[str, bytes]
    ids: bytes
    exemplars: list[tuple[float, str]]
    applied: dict[int, int]
    prompts: dict[str, tuple[int, int, list[tuple[float, str]]]]


def mark_stored(bucket: Bucket, version: int, *, whole: bool) -> None:
    """The bucket's record of ``version`` was taken: what it holds now is stored."""
    bucket.version = version
    if whole:
        bucket.base = version
    if bucket.ids is None:
        bucket.marks = bucket.new_ids = None  # closed: whatever comes next is stored whole
        return
    bucket.marks = {name: sketch.mark() for name, sketch in bucket.digests.items()}
    bucket.new_ids = []


def segment_bytes(bucket: Bucket) -> bytes | None:
    """A segment of what ``bucket`` gained since its last record (version
    ``bucket.version + 1``), or None when it must be stored whole: never
    stored, closed, restored empty, or :data:`MAX_SEGMENTS` on its base."""
    marks, new_ids = bucket.marks, bucket.new_ids
    if (
        marks is None
        or new_ids is None
        or bucket.ids is None
        or bucket.refill
        or bucket.version - bucket.base >= MAX_SEGMENTS
    ):
        return None
    added: dict[str, bytes] = {}
    whole: dict[str, bytes] = {}
    for name, sketch in sorted(bucket.digests.items()):
        mark = marks.get(name)
        values = None if mark is None else sketch.since(mark)
        if values is None:
            whole[name] = sketch.to_bytes()
        elif values.size:
            added[name] = values.tobytes()
    segment = _Segment(
        base=bucket.base,
        version=bucket.version + 1,
        counters=bucket.counters.as_list(),
        added=added,
        whole=whole,
        ids=np.array(new_ids, dtype=np.uint64).tobytes(),
        exemplars=bucket.exemplars,
        applied=dict(sorted(bucket.applied.items())),
        prompts={
            name: (t.requests, t.bad, t.exemplars) for name, t in sorted(bucket.prompts.items())
        },
    )
    return msgspec.msgpack.encode(segment)


def apply_segment(bucket: Bucket, data: bytes, version: int, *, key: object = None) -> bool:
    """Add a stored segment to ``bucket`` (restored up to the version before
    ``version``). False, and the bucket unchanged, when the segment is not the
    one that follows (it extends another base, or is another version)."""
    try:
        seg = msgspec.msgpack.decode(data, type=_Segment)
        counters = Counters.from_list(seg.counters)
        added = {n: np.frombuffer(v, dtype=np.float64) for n, v in seg.added.items()}
        whole = {n: Sketch.from_bytes(v, DEFAULT_MAX_CENTROIDS) for n, v in seg.whole.items()}
        ids = np.frombuffer(seg.ids, dtype=np.uint64).tolist()
    except (msgspec.DecodeError, ValueError, TypeError) as exc:
        msg = (
            f"bucket segment {key!r} does not decode ({exc}); delete the worker data dir "
            "and let it restore from the changelog"
        )
        raise CorruptStateError(msg) from exc
    if (
        seg.base != bucket.base
        or seg.version != version
        or bucket.ids is None
        or any(name not in bucket.digests for name in added)
    ):
        return False
    for name, values in added.items():
        bucket.digests[name].add(values)
    bucket.digests.update(whole)
    bucket.counters = counters
    bucket.ids.update(ids)
    bucket.exemplars = [(float(e), str(t)) for e, t in seg.exemplars]
    bucket.applied = dict(seg.applied)
    bucket.prompts = {
        name: PromptTally(n, bad, [(float(e), str(t)) for e, t in ex])
        for name, (n, bad, ex) in seg.prompts.items()
    }
    bucket.version = version
    return True
