"""Buckets stored as a whole record plus segments of what they gained since.

A restore that reads a bucket's whole record and then its segments, in order,
must give the bucket bytes for bytes, however its values came (exact sketches,
digests that merge chunks between two checkpoints, new sketches, duplicates);
a broken chain must read as a lost record, never as a wrong bucket.
"""

from typing import Any

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.streams import RingConfig, SeriesWindows, Thresholds
from tailguard.streams.bucket import Bucket
from tailguard.streams.bucket_log import MAX_SEGMENTS, _Segment
from tailguard.streams.columns import Columns
from tailguard.streams.digest import DEFAULT_MAX_CENTROIDS, Sketch
from tailguard.streams.ring_store import RingRecords, chains, restore_bucket
from tailguard.streams.window_config import FINE

START = 1_700_000_040_000


def grow(make_event: Any, bucket: Bucket, round_: int, requests: int, bulk: int, seed: int) -> None:
    """Fold ``requests`` new requests (one id of the round before again: a duplicate)
    and ``bulk`` extra ITL values into ``bucket``, as the fold does."""
    rng = np.random.default_rng(seed)
    reqs = [
        make_event(
            START,
            event_id=f"{round_}-{i}" if i else f"{max(0, round_ - 1)}-0",
            e2e_ms=float(rng.uniform(200, 900)),
            ttft_ms=float(rng.uniform(50, 190)),
            output_tokens=int(rng.integers(2, 40)),
            itl_ms=rng.uniform(5, 60, int(rng.integers(0, 9))).round(3).tolist(),
            trace_id=f"{round_:016x}{i:016x}" if i % 3 == 0 else None,
        )
        for i in range(requests)
    ]
    cols = Columns.from_events(reqs)
    assert bucket.ids is not None
    hashes = cols.ids.tolist()
    fresh = [j for j, h in enumerate(hashes) if h not in bucket.ids]
    bucket.ids.update(hashes[j] for j in fresh)
    bucket.note_ids([hashes[j] for j in fresh])
    if fresh:
        index = np.array(fresh, dtype=np.int64)
        bucket.absorb(cols, index, DEFAULT_MAX_CENTROIDS, Thresholds())
    if bulk:
        sketch = bucket.digests.setdefault("itl_ms", Sketch(DEFAULT_MAX_CENTROIDS))
        sketch.add(rng.lognormal(np.log(40.0), 0.5, bulk))
    bucket.applied[0] = round_


class Store:
    """A table partition: the records a checkpoint writes, deletes applied."""

    def __init__(self) -> None:
        self.records: dict[Any, bytes] = {}
        self.pending = RingRecords()
        self.written = 0

    def checkpoint(self, fine: dict[int, Bucket]) -> Any:
        for start in fine:
            self.pending.touch(FINE, start)
        changes = self.pending.take(fine, {}, lambda: b"")
        self.records.update(changes.upserts)
        self.written += sum(map(len, changes.upserts.values()))
        for key in changes.deletes:
            self.records.pop(key, None)
        return changes

    def restore(self, fine: dict[int, Bucket]) -> Bucket | None:
        return restore_bucket(FINE, START, chains(fine).get(START), self.records.get)


rounds = st.lists(
    st.tuples(
        st.integers(0, 40), st.sampled_from([0, 0, 30, 300, 1_100]), st.integers(0, 2**32 - 1)
    ),
    min_size=1,
    max_size=MAX_SEGMENTS + 4,
)


@settings(max_examples=120, deadline=None)
@given(rounds=rounds, close_at=st.integers(0, MAX_SEGMENTS + 6))
def test_whole_record_and_segments_restore_the_bucket_bytes_for_bytes(
    make_event: Any, rounds: list[tuple[int, int, int]], close_at: int
) -> None:
    bucket = Bucket.empty(START)
    fine = {START: bucket}
    store = Store()
    for k, (requests, bulk, seed) in enumerate(rounds, start=1):
        if k == close_at:
            bucket.close()
        elif bucket.ids is not None:
            grow(make_event, bucket, k, requests, bulk, seed)
        store.checkpoint(fine)
        restored = store.restore(fine)
        assert restored is not None
        assert restored.to_bytes() == bucket.to_bytes()
        assert restored.ids == bucket.ids
        # Nothing stale is left: the whole record and the segments on it.
        assert set(store.records) == {(FINE, START)} | {
            (FINE, START, v) for v in range(bucket.base + 1, bucket.version + 1)
        }


def test_a_segment_holds_what_the_bucket_gained_not_the_bucket(make_event: Any) -> None:
    bucket = Bucket.empty(START)
    fine = {START: bucket}
    store = Store()
    grow(make_event, bucket, 1, 200, 0, seed=1)  # exact sketches, some 900 ITL values
    first = store.checkpoint(fine)
    grow(make_event, bucket, 2, 10, 0, seed=2)
    second = store.checkpoint(fine)
    (whole,) = first.upserts.values()
    (key, segment), *_ = second.upserts.items()
    assert key == (FINE, START, 2)
    assert len(segment) * 8 < len(whole)
    # ITL becomes a digest and merges a chunk: the values it gained, not the digest.
    grow(make_event, bucket, 3, 0, 1_100, seed=3)
    (segment,) = store.checkpoint(fine).upserts.values()
    assert not msgspec.msgpack.decode(segment, type=_Segment).whole
    assert store.restore(fine).to_bytes() == bucket.to_bytes()  # type: ignore[union-attr]
    # A digest that merged no chunk since: only the new end of its tail.
    grow(make_event, bucket, 4, 0, 50, seed=4)
    (segment,) = store.checkpoint(fine).upserts.values()
    assert len(segment) < 50 * 8 + 600
    assert store.restore(fine).to_bytes() == bucket.to_bytes()  # type: ignore[union-attr]
    # A digest that merged a chunk since: its values again, fewer bytes than the digest.
    grow(make_event, bucket, 5, 0, 1_100, seed=5)
    (segment,) = store.checkpoint(fine).upserts.values()
    stored = msgspec.msgpack.decode(segment, type=_Segment)
    assert not stored.whole and len(stored.added["itl_ms"]) == 1_100 * 8
    assert store.restore(fine).to_bytes() == bucket.to_bytes()  # type: ignore[union-attr]
    # More merged since than a digest's bytes: the sketch whole again.
    grow(make_event, bucket, 6, 0, 3_000, seed=6)
    (segment,) = store.checkpoint(fine).upserts.values()
    stored = msgspec.msgpack.decode(segment, type=_Segment)
    assert list(stored.whole) == ["itl_ms"] and "itl_ms" not in stored.added
    assert store.restore(fine).to_bytes() == bucket.to_bytes()  # type: ignore[union-attr]


def test_every_max_segments_the_bucket_is_stored_whole_and_its_segments_go(make_event: Any) -> None:
    bucket = Bucket.empty(START)
    fine = {START: bucket}
    store = Store()
    for k in range(1, MAX_SEGMENTS + 3):
        grow(make_event, bucket, k, 3, 0, seed=k)
        changes = store.checkpoint(fine)
    # Version 1 whole, 2…MAX_SEGMENTS + 1 segments, then whole again, then a segment.
    assert (bucket.base, bucket.version) == (MAX_SEGMENTS + 2, MAX_SEGMENTS + 2)
    assert set(changes.upserts) == {(FINE, START)}
    assert set(changes.deletes) == {(FINE, START, v) for v in range(2, MAX_SEGMENTS + 2)}


def test_a_closed_bucket_is_stored_whole(make_event: Any) -> None:
    bucket = Bucket.empty(START)
    fine = {START: bucket}
    store = Store()
    grow(make_event, bucket, 1, 5, 0, seed=1)
    store.checkpoint(fine)
    grow(make_event, bucket, 2, 5, 0, seed=2)
    store.checkpoint(fine)
    bucket.close()
    changes = store.checkpoint(fine)
    assert set(changes.upserts) == {(FINE, START)}
    assert set(changes.deletes) == {(FINE, START, 2)}
    assert Bucket.from_bytes(changes.upserts[(FINE, START)]).ids is None


def _chain_of_three(
    make_event: Any,
) -> tuple[Store, dict[int, Bucket], tuple[int, int], list[bytes]]:
    """A bucket stored whole (version 1), then as two segments; its bytes after each."""
    bucket = Bucket.empty(START)
    fine = {START: bucket}
    store = Store()
    stored = []
    for k in (1, 2, 3):
        grow(make_event, bucket, k, 4, 0, seed=k)
        store.checkpoint(fine)
        stored.append(bucket.to_bytes())
    return store, fine, chains(fine)[START], stored


def test_a_missing_segment_leaves_the_bucket_as_it_was_before_it(make_event: Any) -> None:
    """As an older whole record would: its input offsets make the replay add the rest."""
    store, _, chain, stored = _chain_of_three(make_event)
    assert chain == (1, 3)
    del store.records[(FINE, START, 2)]
    restored = restore_bucket(FINE, START, chain, store.records.get)
    assert restored is not None
    assert restored.to_bytes() == stored[0]
    # Its next record is whole, numbered past every version the meta knew.
    assert restored.version == 3


def test_a_segment_of_another_base_ends_the_chain(make_event: Any) -> None:
    store, _, chain, stored = _chain_of_three(make_event)
    # Version 3 as a lost timeline wrote it, on another base.
    store.records[(FINE, START, 3)] = _reversioned(store.records[(FINE, START, 3)], base=7)
    restored = restore_bucket(FINE, START, chain, store.records.get)
    assert restored is not None
    assert restored.to_bytes() == stored[1]


def _reversioned(segment: bytes, base: int) -> bytes:
    fields = msgspec.msgpack.decode(segment)
    fields[0] = base
    return msgspec.msgpack.encode(fields)


def test_a_whole_record_newer_than_the_meta_is_read_alone(make_event: Any) -> None:
    store, fine, chain, _ = _chain_of_three(make_event)
    fine[START].marks = None  # the next record is whole: version 4, ahead of the chain
    grow(make_event, fine[START], 4, 4, 0, seed=4)
    store.checkpoint(fine)
    restored = restore_bucket(FINE, START, chain, store.records.get)
    assert restored is not None
    assert restored.to_bytes() == fine[START].to_bytes()


def test_a_whole_record_older_than_the_meta_is_read_alone(make_event: Any) -> None:
    store, _, _, stored = _chain_of_three(make_event)
    restored = restore_bucket(FINE, START, (5, 6), store.records.get)
    assert restored is not None
    assert restored.to_bytes() == stored[0]
    assert restored.version == 6


def test_a_lost_whole_record_is_a_lost_bucket(make_event: Any) -> None:
    store, _, chain, _ = _chain_of_three(make_event)
    del store.records[(FINE, START)]
    assert restore_bucket(FINE, START, chain, store.records.get) is None


def test_a_bucket_restored_empty_takes_versions_past_its_lost_chain(make_event: Any) -> None:
    """Its next whole record deletes the lost chain's segments; its own never reuse them."""
    ring = SeriesWindows(RingConfig())
    ring.add([make_event(START + 1_000, event_id="a")])
    store: dict[Any, bytes] = {}
    for k in range(3):
        ring.add([make_event(START + 2_000 + k, event_id=f"b{k}")])
        store.update(ring.take_changes().upserts)
    meta = ring.take_changes().meta
    del store[(FINE, START)]  # a record lost in a crash
    restored = SeriesWindows.restore(meta, store.get)
    assert restored.fine[START].refill
    restored.add([make_event(START + 3_000, event_id="c")])
    changes = restored.take_changes()
    assert set(changes.upserts) == {(FINE, START)}
    assert Bucket.from_bytes(changes.upserts[(FINE, START)]).version == 4
    assert {(FINE, START, 2), (FINE, START, 3)} <= set(changes.deletes)
