"""``Bucket`` as a pure reducer: merge is associative, serialise ∘ deserialise = identity."""

from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.streams import PERCENTILES, CorruptStateError, Thresholds
from tailguard.streams.bucket import EXEMPLARS, METRICS, Bucket, sum_counters
from tailguard.streams.columns import Columns, event_hash, event_hashes
from tailguard.streams.counters import Counters
from tailguard.streams.digest import DEFAULT_MAX_CENTROIDS, Sketch

MC = DEFAULT_MAX_CENTROIDS


@dataclass(frozen=True, slots=True)
class Recipe:
    """How to build one bucket: a few requests, plus bulk samples so digests compress."""

    requests: tuple[
        tuple[str, float, float | None, int | None, tuple[float, ...], str | None, bool], ...
    ]
    bulk: int
    seed: int
    closed: bool
    applied: tuple[tuple[int, int], ...]


latency = st.floats(min_value=0.0, max_value=60_000.0, allow_nan=False)
request = st.tuples(
    st.sampled_from(["ok", "ok", "ok", "error", "timeout", "cancelled", "rejected"]),
    latency,
    st.none() | latency,
    st.none() | st.integers(min_value=0, max_value=4_000),
    st.lists(latency, max_size=6).map(tuple),
    st.none() | st.text(alphabet="0123456789abcdef", min_size=32, max_size=32),
    st.booleans(),
)
recipes = st.builds(
    Recipe,
    requests=st.lists(request, max_size=12).map(tuple),
    bulk=st.sampled_from([0, 0, 50, 400, 3_000]),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    closed=st.booleans(),
    applied=st.lists(st.tuples(st.integers(0, 63), st.integers(0, 2**40)), max_size=3).map(tuple),
)


@dataclass
class _Req:
    event_id: str
    ts_ms: int
    status: str
    e2e_ms: float
    ttft_ms: float | None
    output_tokens: int | None
    itl_ms: list[float] | None
    trace_id: str | None
    warmup: bool | None


def build(recipe: Recipe, start_ms: int = 0, thresholds: Thresholds | None = None) -> Bucket:
    """Fold a recipe into a fresh bucket the way ``SeriesWindows.add`` does."""
    thresholds = thresholds or Thresholds()
    bucket = Bucket.empty(start_ms)
    reqs = [
        _Req(f"{recipe.seed}-{i}", start_ms, status, e2e, ttft, out, list(itl), trace, warmup)
        for i, (status, e2e, ttft, out, itl, trace, warmup) in enumerate(recipe.requests)
    ]
    cols = Columns.from_events(reqs)
    assert bucket.ids is not None
    bucket.ids.update(cols.ids.tolist())
    bucket.absorb(cols, np.arange(len(reqs)), MC, thresholds)
    if recipe.bulk:
        # Digest-only samples: enough values that the digests must compress.
        rng = np.random.default_rng(recipe.seed)
        for name, values in (
            ("ttft_ms", rng.lognormal(np.log(300.0), 0.6, recipe.bulk)),
            ("itl_ms", rng.lognormal(np.log(40.0), 0.5, recipe.bulk)),
        ):
            bucket.digests.setdefault(name, Sketch(MC)).add(values)
    bucket.applied.update(dict(recipe.applied))
    if recipe.closed:
        bucket.close()
    return bucket


def copy(bucket: Bucket) -> Bucket:
    return Bucket.from_bytes(bucket.to_bytes())


def merge(*buckets: Bucket) -> Bucket:
    out = Bucket.empty(0)
    out.ids = None
    for b in buckets:
        out.merge(b, MC)
    return out


def assert_same_digest_quantiles(left: Bucket, right: Bucket, rel: float) -> None:
    assert left.digests.keys() == right.digests.keys()
    for metric, digest in left.digests.items():
        other = right.digests[metric]
        assert digest.n_values == other.n_values, metric
        assert digest.min() == other.min() and digest.max() == other.max(), metric
        for q in PERCENTILES.values():
            assert digest.quantile(q) == pytest.approx(other.quantile(q), rel=rel, abs=1e-9), (
                metric,
                q,
            )


# ------------------------------------------------------------------ merge


@settings(max_examples=60, deadline=None)
@given(recipes, recipes, recipes)
def test_bucket_merge_is_associative(a: Recipe, b: Recipe, c: Recipe) -> None:
    ba, bb, bc = build(a), build(b), build(c)
    left = merge(merge(copy(ba), copy(bb)), copy(bc))
    right = merge(copy(ba), merge(copy(bb), copy(bc)))
    assert left.counters == right.counters
    assert left.exemplars == right.exemplars
    assert_same_digest_quantiles(left, right, rel=0.02)


@settings(max_examples=40, deadline=None)
@given(recipes, recipes)
def test_bucket_merge_adds_counters_exactly(a: Recipe, b: Recipe) -> None:
    ba, bb = build(a), build(b)
    total = merge(ba, bb).counters.as_list()
    assert total == [
        x + y for x, y in zip(ba.counters.as_list(), bb.counters.as_list(), strict=True)
    ]


def test_merging_into_a_window_leaves_the_source_buckets_untouched() -> None:
    values = np.random.default_rng(3).lognormal(np.log(300.0), 0.6, 1_000).tolist()
    a = build(Recipe(requests=(), bulk=1_000, seed=1, closed=True, applied=()))
    b = build(Recipe(requests=(), bulk=1_000, seed=2, closed=True, applied=()))
    before_a, before_b = a.to_bytes(), b.to_bytes()
    window = merge(a, b)
    window.digests["ttft_ms"].add(values)
    assert a.to_bytes() == before_a
    assert b.to_bytes() == before_b
    assert window.digests["ttft_ms"].n_values == 3_000


def test_merge_keeps_the_slowest_exemplars() -> None:
    requests = tuple(
        ("ok", float(e2e), 100.0, 2, (), f"{e2e:032x}", False) for e2e in (5, 50, 7, 70, 1, 10)
    )
    a = build(Recipe(requests=requests[:3], bulk=0, seed=0, closed=True, applied=()))
    b = build(Recipe(requests=requests[3:], bulk=0, seed=0, closed=True, applied=()))
    window = merge(a, b)
    assert [e2e for e2e, _ in window.exemplars] == [70.0, 50.0, 10.0, 7.0, 5.0]
    assert len(window.exemplars) == EXEMPLARS


# ------------------------------------------------------------------ serialise


@settings(max_examples=80, deadline=None)
@given(recipes, st.integers(min_value=0, max_value=2**50))
def test_bucket_serialise_then_deserialise_is_identity(recipe: Recipe, start_ms: int) -> None:
    bucket = build(recipe, start_ms=start_ms)
    restored = Bucket.from_bytes(bucket.to_bytes())
    assert restored.start_ms == bucket.start_ms
    assert restored.counters == bucket.counters
    assert restored.ids == bucket.ids
    assert restored.exemplars == bucket.exemplars
    assert restored.applied == bucket.applied
    assert_same_digest_quantiles(restored, bucket, rel=0.0)
    for metric in bucket.digests:
        assert restored.digests[metric].to_bytes() == bucket.digests[metric].to_bytes()


def test_a_closed_bucket_serialises_without_event_ids() -> None:
    one = (("ok", 1.0, 1.0, 1, (), None, False),)
    bucket = build(Recipe(requests=one, bulk=0, seed=0, closed=True, applied=()))
    assert bucket.ids is None
    assert Bucket.from_bytes(bucket.to_bytes()).ids is None


def test_event_hash_is_pinned_so_stored_ids_stay_valid_across_processes() -> None:
    # Stored buckets hold these hashes: Python's own ``hash`` of a str changes per
    # process (PYTHONHASHSEED), and a changed function would miss every duplicate
    # after a restart.
    def fnv1a64(data: bytes) -> int:
        h = 0xCBF29CE484222325
        for byte in data:
            h = ((h ^ byte) * 0x100000001B3) % 2**64
        return h

    ids = ["req-1", "req-2", "", "é-ü", "x" * 64, "a" * 30 + "b"]
    assert event_hashes(ids).tolist() == [fnv1a64(i.encode()) for i in ids]
    assert event_hash("a") == 0xAF63DC4C8601EC8C  # the published FNV-1a 64 test vector
    assert event_hash("req-1") != event_hash("req-2")
    # Longer ids are hashed through their BLAKE2b digest: still stable and distinct.
    assert event_hash("y" * 65) == event_hash("y" * 65) != event_hash("y" * 66)


# ------------------------------------------------------------------ corrupt bytes


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=256))
def test_arbitrary_bytes_raise_corrupt_state_error(data: bytes) -> None:
    with pytest.raises(CorruptStateError):
        Bucket.from_bytes(data, key=("m", 0))


def test_every_truncation_of_a_bucket_raises_corrupt_state_error() -> None:
    data = build(Recipe(requests=(), bulk=400, seed=9, closed=False, applied=((0, 7),))).to_bytes()
    for cut in range(len(data)):
        with pytest.raises(CorruptStateError):
            Bucket.from_bytes(data[:cut])


def test_corrupt_digest_bytes_raise_corrupt_state_error_naming_the_key() -> None:
    wire = [0, [0] * 11, {"ttft_ms": b"not a digest"}, None, [], {}]
    with pytest.raises(CorruptStateError, match=r"\('m', 60000\)"):
        Bucket.from_bytes(msgspec.msgpack.encode(wire), key=("m", 60_000))


def _wire(**override: object) -> bytes:
    fields: dict[str, object] = {
        "start_ms": 0,
        "counters": [0] * 11,
        "digests": {},
        "ids": None,
        "exemplars": [],
        "applied": {},
    }
    fields.update(override)
    return msgspec.msgpack.encode(list(fields.values()))


CorruptCase = Callable[[], bytes]


def test_event_ids_of_a_wrong_length_raise_corrupt_state_error() -> None:
    with pytest.raises(CorruptStateError):
        Bucket.from_bytes(_wire(ids=b"\x01\x02\x03"), key=("m", 0))


def test_a_counters_list_longer_than_the_counters_raises_corrupt_state_error() -> None:
    with pytest.raises(CorruptStateError):
        Bucket.from_bytes(_wire(counters=[1] * (len(Counters().as_list()) + 1)), key=("m", 0))


def test_a_bucket_stored_before_the_cause_counters_existed_restores_them_as_zero() -> None:
    legacy = list(range(1, 12))  # the 11 SLI counters of the first state format
    bucket = Bucket.from_bytes(_wire(counters=legacy), key=("m", 0))
    values = bucket.counters.as_list()
    assert values[:11] == legacy
    assert values[11:] == [0] * (len(values) - 11)


def test_every_metric_has_a_digest_after_a_full_request() -> None:
    recipe = Recipe(
        requests=(("ok", 1_500.0, 300.0, 11, (100.0, 110.0), None, False),),
        bulk=0,
        seed=0,
        closed=False,
        applied=(),
    )
    assert set(build(recipe).digests) == set(METRICS)


def _one_more(bucket: Bucket, event_id: str) -> None:
    req = _Req(event_id, bucket.start_ms, "ok", 900.0, 120.0, 8, [30.0, 40.0], None, False)
    bucket.absorb(Columns.from_events([req]), np.arange(1), MC, Thresholds())


def test_a_closed_buckets_counter_row_follows_a_refill() -> None:
    bucket = Bucket.empty(0)
    _one_more(bucket, "a")
    bucket.close()
    first = bucket.counter_row().tolist()
    assert first == bucket.counters.as_list()
    _one_more(bucket, "b")  # a replay refilling the closed bucket
    assert bucket.counter_row().tolist() == bucket.counters.as_list() != first


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.builds(
            Recipe,
            requests=st.lists(request, max_size=8).map(tuple),
            bulk=st.just(0),
            seed=st.integers(0, 99),
            closed=st.booleans(),
            applied=st.just(()),
        ),
        max_size=6,
    )
)
def test_summed_counters_equal_adding_them_one_by_one(recipes: list[Recipe]) -> None:

    parts = [build(r) for r in recipes]
    one_by_one = Counters()
    for part in parts:
        one_by_one.add(part.counters)
    assert sum_counters(parts) == one_by_one
    assert sum_counters(parts) == sum_counters(parts)  # cached rows change nothing
