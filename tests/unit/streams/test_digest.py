"""The digest wire format: the ``tdigest`` package's dict, checked against ``tdigest`` itself.

``tdigest`` (pure Python) is the reference oracle here: it is what a
subscriber of ``tailguard.sli`` uses to load the published digests.
"""

import itertools
import json

import numpy as np
import pytest
import tdigest
from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.streams import PERCENTILES, Bucket, Thresholds, summarize
from tailguard.streams.digest import (
    CHUNK,
    DEFAULT_MAX_CENTROIDS,
    EXACT_LIMIT,
    KEPT_SINCE_MARK,
    READ_EXACT_LIMIT,
    Sketch,
    TDigest,
    add_values,
    counts_and_quantiles,
    digest_of,
    from_tdigest_dict,
    new_digest,
    to_tdigest_dict,
)

QUANTILES = list(PERCENTILES.values())


@pytest.fixture(scope="module")
def window_digest() -> TDigest:
    """A window-like digest: 100 000 lognormal TTFTs folded in 200 at a time."""
    values = np.random.default_rng(11).lognormal(np.log(300.0), 0.6, 100_000)
    digest = None
    for i in range(0, values.size, 200):
        digest = add_values(digest, values[i : i + 200], DEFAULT_MAX_CENTROIDS)
    assert digest is not None
    return digest


def test_tdigest_dict_has_the_tdigest_package_layout(window_digest: TDigest) -> None:
    wire = to_tdigest_dict(window_digest)
    assert set(wire) == {"n", "delta", "K", "centroids"}
    assert wire["n"] == 100_000
    assert all(set(c) == {"m", "c"} for c in wire["centroids"])
    assert sum(c["c"] for c in wire["centroids"]) == pytest.approx(100_000)
    means = [c["m"] for c in wire["centroids"]]
    assert means == sorted(means)
    assert len(wire["centroids"]) <= DEFAULT_MAX_CENTROIDS + 1


def test_tdigest_dict_survives_json(window_digest: TDigest) -> None:
    wire = to_tdigest_dict(window_digest)
    assert json.loads(json.dumps(wire)) == wire


def test_tdigest_package_loads_the_dict_and_gives_the_same_percentiles(
    window_digest: TDigest,
) -> None:
    oracle = tdigest.TDigest().update_from_dict(to_tdigest_dict(window_digest))
    assert oracle.n == pytest.approx(window_digest.n_values)
    for q in QUANTILES:
        assert oracle.percentile(q * 100) == pytest.approx(window_digest.quantile(q), rel=0.01), q


def test_published_window_digests_load_into_the_tdigest_package(window_digest: TDigest) -> None:
    bucket = Bucket.empty(0)
    bucket.digests["ttft_ms"] = Sketch.from_digest(window_digest)
    summary = summarize(bucket, 60_000, Thresholds(), with_digests=True)
    assert summary.digests is not None
    oracle = tdigest.TDigest().update_from_dict(summary.digests["ttft_ms"])
    assert oracle.percentile(99) == pytest.approx(summary.latency["ttft_ms"]["p99"], rel=0.01)


def test_from_tdigest_dict_round_trips_the_centroids_exactly(window_digest: TDigest) -> None:
    wire = to_tdigest_dict(window_digest)
    assert to_tdigest_dict(from_tdigest_dict(wire)) == wire


def test_from_tdigest_dict_round_trips_the_published_percentiles(window_digest: TDigest) -> None:
    restored = from_tdigest_dict(to_tdigest_dict(window_digest))
    assert restored.n_values == window_digest.n_values
    for q in QUANTILES:
        assert restored.quantile(q) == pytest.approx(window_digest.quantile(q), rel=1e-9), q


def test_from_tdigest_dict_loads_a_digest_built_by_the_tdigest_package() -> None:
    values = np.random.default_rng(5).lognormal(np.log(40.0), 0.5, 5_000)
    oracle = tdigest.TDigest()
    oracle.batch_update(values.tolist())
    loaded = from_tdigest_dict(oracle.to_dict())
    assert loaded.n_values == 5_000
    for q in QUANTILES[:-1]:  # P99.9 of 5 000 values sits on one or two samples
        assert loaded.quantile(q) == pytest.approx(oracle.percentile(q * 100), rel=0.01), q


def test_an_empty_digest_round_trips_to_an_empty_digest() -> None:
    wire = to_tdigest_dict(new_digest())
    assert wire["centroids"] == []
    assert from_tdigest_dict(wire).is_empty()
    assert from_tdigest_dict({}).is_empty()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.floats(min_value=0.0, max_value=3_600_000.0, allow_nan=False),
        min_size=1,
        max_size=2_000,
    )
)
def test_any_latency_digest_round_trips_through_the_dict(values: list[float]) -> None:
    digest = add_values(None, values, DEFAULT_MAX_CENTROIDS)
    wire = to_tdigest_dict(digest)
    restored = from_tdigest_dict(wire)
    assert to_tdigest_dict(restored) == wire
    assert restored.n_values == len(values)
    for q in QUANTILES:
        assert restored.quantile(q) == pytest.approx(digest.quantile(q), rel=1e-9, abs=1e-9)


def test_a_sketch_stays_exact_up_to_the_limit_then_becomes_a_digest() -> None:
    values = np.random.default_rng(2).lognormal(5.0, 0.5, EXACT_LIMIT + 1)
    sketch = Sketch.of(values[:EXACT_LIMIT])
    assert sketch.exact
    assert sketch.quantile(0.99) == pytest.approx(float(np.percentile(values[:EXACT_LIMIT], 99)))
    sketch.add(values[EXACT_LIMIT:])
    assert not sketch.exact and sketch.n_values == EXACT_LIMIT + 1


def test_combining_exact_and_digest_sketches_keeps_every_value() -> None:
    rng = np.random.default_rng(3)
    small = [Sketch.of(rng.lognormal(5.0, 0.5, 10)) for _ in range(5)]
    big = Sketch.of(rng.lognormal(5.0, 0.5, 5_000))
    assert Sketch.combine(small, 1000).exact
    both = Sketch.combine([*small, big], 1000)
    assert both.n_values == 5_050 and not both.exact


def test_a_window_read_without_digests_stays_exact_up_to_the_read_limit() -> None:
    # Minute buckets of a few more values than a sketch keeps exact: digest form
    # with every value still in the tail (below one merge chunk).
    rng = np.random.default_rng(4)
    parts = [Sketch.of(rng.lognormal(3.5, 0.4, EXACT_LIMIT + 10)) for _ in range(5)]
    assert not any(p.exact for p in parts)
    values = np.concatenate([p._tail for p in parts])
    read = Sketch.combine(parts, 1000, READ_EXACT_LIMIT)
    assert read.exact and read.n_values == values.size
    assert read.quantiles(QUANTILES) == pytest.approx(
        [float(np.quantile(values, q)) for q in QUANTILES], rel=1e-12
    )
    # Stored (roll-up) combines keep the storage limit; past the read limit, a digest.
    assert not Sketch.combine(parts, 1000).exact
    many = [Sketch.of(rng.lognormal(3.5, 0.4, 1000)) for _ in range(READ_EXACT_LIMIT // 1000 + 1)]
    assert not Sketch.combine(many, 1000, READ_EXACT_LIMIT).exact


@pytest.mark.parametrize("n", [0, 7, EXACT_LIMIT + 50])
def test_sketch_bytes_round_trip(n: int) -> None:
    values = np.random.default_rng(n).lognormal(5.0, 0.5, n)
    sketch = Sketch.of(values)
    back = Sketch.from_bytes(sketch.to_bytes())
    assert back.n_values == n and back.exact == sketch.exact
    if n:
        assert back.quantiles([0.5, 0.99]) == pytest.approx(sketch.quantiles([0.5, 0.99]))


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=5_000),
    cuts=st.lists(st.integers(min_value=0, max_value=5_000), max_size=12),
)
def test_a_sketch_is_the_same_bytes_however_its_values_were_batched(
    n: int, cuts: list[int]
) -> None:
    from tailguard.streams.digest import Sketch

    values = np.random.default_rng(n).lognormal(np.log(50.0), 0.7, n)
    whole = Sketch(1000)
    whole.add(values)
    pieces = Sketch(1000)
    bounds = [0, *sorted(c for c in cuts if c < n), n]
    for lo, hi in itertools.pairwise(bounds):
        pieces.add(values[lo:hi])
    assert pieces.to_bytes() == whole.to_bytes()
    assert pieces.n_values == n
    restored = Sketch.from_bytes(whole.to_bytes(), 1000)
    assert restored.to_bytes() == whole.to_bytes()
    if n:
        assert restored.quantiles([0.5, 0.99]) == whole.quantiles([0.5, 0.99])


def test_quantiles_of_many_sketches_are_each_sketchs_own_to_the_bit() -> None:
    rng = np.random.default_rng(5)
    sizes = [1, 2, 3, 17, EXACT_LIMIT, EXACT_LIMIT + 1, 5_000]
    sketches = [Sketch.of(rng.lognormal(4.0, 0.6, n)) for n in sizes]
    assert any(s.exact for s in sketches) and not all(s.exact for s in sketches)
    qs = [0.0, *QUANTILES, 1.0]
    assert [q for _, q in _found(sketches, qs)] == [s.quantiles(qs) for s in sketches]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([1, 2, 5, 60, EXACT_LIMIT, 2_000]), min_size=1, max_size=12),
    seed=st.integers(0, 2**32 - 1),
)
def test_sketches_of_one_size_sorted_together_read_as_each_alone(
    sizes: list[int], seed: int
) -> None:
    """Sketches of the same size share one sort (the rows of one array): each row
    must give that sketch's own quantiles, ties and repeated values included."""
    rng = np.random.default_rng(seed)
    sketches = [Sketch.of(np.round(rng.lognormal(4.0, 0.6, n), 1)) for n in sizes]
    qs = [0.0, *QUANTILES, 1.0]
    assert [q for _, q in _found(sketches, qs)] == [s.quantiles(qs) for s in sketches]


def _found(sketches: list[Sketch], qs: list[float]) -> list[tuple[int, list[float]]]:
    found = counts_and_quantiles(sketches, qs)
    assert [f[0] if f is not None else None for f in found] == [s.n_values for s in sketches]
    return found  # type: ignore[return-value]


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 3_000),
    seed=st.integers(0, 2**32 - 1),
    max_centroids=st.sampled_from([100, DEFAULT_MAX_CENTROIDS]),
)
def test_a_digest_built_from_a_list_is_the_digest_built_from_the_array(
    size: int, seed: int, max_centroids: int
) -> None:
    """digest_of hands fastdigest a list (read faster than an array): the digest,
    stored bytes included, must be the one the array gives."""
    values = np.random.default_rng(seed).lognormal(3.0, 1.2, size)
    built = digest_of(values, max_centroids)
    assert built.to_bytes() == TDigest.from_values(values, max_centroids=max_centroids).to_bytes()


@settings(max_examples=40, deadline=None)
@given(size=st.integers(EXACT_LIMIT + 1, 20_000), seed=st.integers(0, 2**32 - 1))
def test_a_digests_quantiles_read_at_once_are_each_read_alone(size: int, seed: int) -> None:
    sketch = Sketch.of(np.round(np.random.default_rng(seed).lognormal(3.0, 1.5, size), 1))
    assert not sketch.exact
    qs = [0.0, *QUANTILES, 0.123, 1.0]
    digest = sketch.as_digest()
    assert sketch.quantiles(qs) == [float(digest.quantile(q)) for q in qs]


def test_counts_and_quantiles_give_each_sketchs_count_and_exact_quantiles() -> None:
    rng = np.random.default_rng(9)
    sketches = [Sketch.of(rng.lognormal(4.0, 0.6, n)) for n in (3, 60, 60, EXACT_LIMIT + 5)]
    sketches.insert(2, Sketch())
    found = counts_and_quantiles(sketches, QUANTILES)
    assert found[2] is None, "an empty sketch has neither"
    assert [f[0] for f in found if f is not None] == [3, 60, 60, EXACT_LIMIT + 5]
    assert found[-1] == (EXACT_LIMIT + 5, sketches[-1].quantiles(QUANTILES)), "a digest too"
    for sketch, got in zip(sketches[:2] + sketches[3:4], found[:2] + found[3:4], strict=True):
        assert got is not None and got[1] == sketch.quantiles(QUANTILES)


@pytest.mark.parametrize("n", [EXACT_LIMIT, EXACT_LIMIT + 1, 1_500, 5_000])
def test_a_compacted_sketch_reads_as_before_and_holds_no_tail(n: int) -> None:
    sketch = Sketch.of(np.random.default_rng(n).lognormal(3.5, 0.4, n))
    before = sketch.quantiles(QUANTILES)
    settled_before = sketch.settled
    sketch.compact()
    assert sketch.settled and sketch.n_values == n
    # Exact sketches, and digests whose values fill whole chunks, have nothing to fold.
    assert settled_before == (sketch.exact or n % 1024 == 0)
    assert sketch.quantiles(QUANTILES) == before  # what a read folded in, to the bit
    assert Sketch.combine([sketch], 1000).quantiles(QUANTILES) == before


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 700), min_size=2, max_size=8),
    cut=st.integers(1, 7),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_values_since_a_mark_rebuild_the_sketch_bytes_for_bytes(
    sizes: list[int], cut: int, seed: int
) -> None:
    """What a bucket segment stores of a sketch: re-adding the values since a mark to
    the sketch as it stood then gives the sketch as it stands, or ``since`` says
    they are merged away (never a wrong answer)."""
    rng = np.random.default_rng(seed)
    batches = [rng.lognormal(np.log(40.0), 0.5, n) for n in sizes]
    cut = min(cut, len(batches) - 1)
    sketch = Sketch(DEFAULT_MAX_CENTROIDS)
    for values in batches[:cut]:
        sketch.add(values)
    then, mark = sketch.to_bytes(), sketch.mark()
    for values in batches[cut:]:
        sketch.add(values)
    added = sketch.since(mark)
    everything = np.concatenate(batches[cut:])
    before = sum(sizes[:cut])
    after = before + everything.size
    still_exact = after <= EXACT_LIMIT
    # Values the digest merged since the mark (promoted after it: all of them).
    merged = after // CHUNK * CHUNK - (before // CHUNK * CHUNK if before > EXACT_LIMIT else 0)
    if still_exact or (after > EXACT_LIMIT and merged <= KEPT_SINCE_MARK):
        assert added is not None
        np.testing.assert_array_equal(added, everything)
    elif after > EXACT_LIMIT:
        assert added is None  # more merged than kept: the sketch is stored whole
    if added is not None:
        rebuilt = Sketch.from_bytes(then, DEFAULT_MAX_CENTROIDS)
        rebuilt.add(added)
        assert rebuilt.to_bytes() == sketch.to_bytes()


def test_values_since_a_mark_are_let_go_once_a_digest_is_merged_in_or_compacted() -> None:
    """A digest merged in, or the tail folded in for good, leaves no values to
    give: the sketch is stored whole then, never rebuilt from values it lacks."""
    rng = np.random.default_rng(7)
    for let_go in ("merge", "compact"):
        sketch = Sketch(DEFAULT_MAX_CENTROIDS)
        sketch.add(rng.lognormal(3.0, 0.5, 1500))
        mark = sketch.mark()
        sketch.add(rng.lognormal(3.0, 0.5, 900))  # one chunk merged, kept
        assert sketch.since(mark) is not None
        if let_go == "merge":
            other = Sketch(DEFAULT_MAX_CENTROIDS)
            other.add(rng.lognormal(3.0, 0.5, 2000))
            sketch.merge_inplace(other)
        else:
            sketch.compact()
        assert sketch.since(mark) is None
        assert sketch.since(sketch.mark()) is not None  # a new mark keeps again


def test_an_earlier_mark_gets_nothing_once_a_newer_one_was_taken() -> None:
    rng = np.random.default_rng(8)
    sketch = Sketch(DEFAULT_MAX_CENTROIDS)
    sketch.add(rng.lognormal(3.0, 0.5, 1500))
    older = sketch.mark()
    sketch.add(rng.lognormal(3.0, 0.5, 700))
    newer = sketch.mark()
    sketch.add(rng.lognormal(3.0, 0.5, 700))
    assert sketch.since(older) is None
    added = sketch.since(newer)
    assert added is not None and added.size == 700
