"""A ledger settles many batches of many series as the batch-by-batch fold would."""

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.streams import SeriesWindows
from tailguard.streams.columns import Columns
from tailguard.streams.fold import fold_many
from tailguard.streams.fold_batch import Ledger, _grouped

from tests.unit.streams.test_ring_properties import SMALL, T0, WINDOW_LENGTHS, MakeEvent


@st.composite
def grouped_parts(draw: Any) -> tuple[int, list[tuple[np.ndarray, np.ndarray]]]:
    """Parts whose owners come in runs (each owner once a part), in any order."""
    n = draw(st.integers(1, 6))
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        owners = draw(st.permutations(range(n)))[: draw(st.integers(0, n))]
        sizes = [draw(st.integers(1, 3)) for _ in owners]
        owner = np.repeat(np.array(owners, dtype=np.int64), sizes)
        values = np.array(
            [draw(st.floats(0, 1e4, allow_nan=False)) for _ in range(owner.size)],
            dtype=np.float64,
        )
        parts.append((values, owner))
    return n, parts


@given(grouped_parts())
def test_grouping_keeps_each_owners_values_in_part_order(
    case: tuple[int, list[tuple[np.ndarray, np.ndarray]]],
) -> None:
    n, parts = case
    values, ends = _grouped(parts, n)
    starts = np.r_[0, ends[:-1]]
    for owner in range(n):
        expected = [v for vs, os in parts for v, o in zip(vs, os, strict=True) if o == owner]
        assert values[starts[owner] : ends[owner]].tolist() == expected


@settings(max_examples=150, deadline=None)
@given(
    n_series=st.integers(1, 4),
    batches=st.lists(
        st.tuples(
            st.permutations(range(4)),  # which series a batch holds, in which order
            st.integers(1, 4),  # how many of them
            st.lists(st.integers(0, 2_500), min_size=1, max_size=4),  # their requests' times
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_one_ledger_over_many_batches_gives_what_settling_each_batch_gives(
    make_event: MakeEvent, n_series: int, batches: list[Any]
) -> None:
    # Series join in later batches, in any order, and buckets open in any order:
    # the buckets a settle meets are not in the order the batches hold them.
    shared = [SeriesWindows(SMALL) for _ in range(n_series)]
    each = [SeriesWindows(SMALL) for _ in range(n_series)]
    ledger = Ledger()
    for k, (order, count, steps) in enumerate(batches):
        chosen = [i for i in order if i < n_series][:count]
        now = T0 + k * 1_500
        groups = [
            [
                make_event(
                    now + step,
                    e2e_ms=100.0 + (i * 37 + j * 11 + k) % 50,
                    ttft_ms=20.0 + j,
                    itl_ms=[5.0 + j, 6.0 + i],
                    trace_id=f"{k:08x}{i:08x}{j:016x}",
                )
                for j, step in enumerate(steps)
            ]
            for i in chosen
        ]
        flat = [e for g in groups for e in g]
        cols = Columns.from_events(flat, [(0, k)] * len(flat))
        bounds = np.r_[0, np.cumsum([len(g) for g in groups])]
        fold_many([shared[i] for i in chosen], cols, bounds, ledger=ledger)
        fold_many([each[i] for i in chosen], cols, bounds)
        for state in each:
            state.settle()
    for a, b in zip(shared, each, strict=True):
        assert a.take_changes() == b.take_changes()
        for w in WINDOW_LENGTHS:
            assert a.window(w).to_bytes() == b.window(w).to_bytes()


def _fold(states: list[SeriesWindows], groups: list[list[Any]], k: int, **kw: Any) -> None:
    flat = [e for g in groups for e in g]
    cols = Columns.from_events(flat, [(0, k)] * len(flat))
    fold_many(states, cols, np.r_[0, np.cumsum([len(g) for g in groups])], **kw)


@settings(max_examples=150, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.integers(0, 4_000), min_size=1, max_size=5),  # times of a batch's requests
        min_size=2,
        max_size=7,
    ),
    reads=st.lists(st.booleans(), min_size=7, max_size=7),  # a read of the newest window after?
)
def test_what_a_close_reads_is_what_settling_every_batch_at_once_gives(
    make_event: MakeEvent, batches: list[list[int]], reads: list[bool]
) -> None:
    # The ledger is settled only for a read of a bucket it owes: a close reads
    # closed minutes, so what a batch put in newer minutes may wait. Every read
    # a close makes, and every read between batches, must see what the eager
    # fold sees.
    lazy, eager = SeriesWindows(SMALL), SeriesWindows(SMALL)
    seen: dict[str, list[list[bytes]]] = {"lazy": [], "eager": []}

    def reading(name: str, state: SeriesWindows) -> Any:
        def on_close(end: int) -> None:
            seen[name].append([state.window(w, end).to_bytes() for w in WINDOW_LENGTHS])

        return on_close

    ledger = Ledger()
    batches = [*batches, [10_000]]  # the last closes every minute before it
    for k, steps in enumerate(batches):
        now = T0 + k * 1_500
        group = [make_event(now + s, e2e_ms=100.0 + (s + k) % 50, ttft_ms=20.0) for s in steps]
        _fold([lazy], [group], k, on_close=[reading("lazy", lazy)], ledger=ledger)
        _fold([eager], [group], k, on_close=[reading("eager", eager)])
        eager.settle()
        if k < len(reads) and reads[k]:
            assert lazy.window(5_000).to_bytes() == eager.window(5_000).to_bytes()
    assert seen["lazy"] == seen["eager"]
    assert seen["lazy"], "some minute closed"
    assert lazy.take_changes() == eager.take_changes()


def test_a_close_leaves_what_the_next_minute_is_owed_until_a_read_needs_it(
    make_event: MakeEvent,
) -> None:
    state, ledger = SeriesWindows(SMALL), Ledger()
    _fold(
        [state],
        [[make_event(T0 + 100, ttft_ms=20.0), make_event(T0 + 200, ttft_ms=30.0)]],
        0,
        ledger=ledger,
    )
    assert ledger.owes(state.fine[T0])
    assert state.window(SMALL.bucket_ms).counters.requests == 2  # a read of it settles
    closed: list[int] = []
    late = T0 + SMALL.bucket_ms + SMALL.allowed_lateness_ms  # closes the first minute
    _fold([state], [[make_event(late, ttft_ms=90.0)]], 1, on_close=[closed.append], ledger=ledger)

    assert closed == [T0 + SMALL.bucket_ms]
    assert not ledger.owes(state.fine[T0])
    assert ledger.owes(state.fine[late]), "the new minute's request waits"
    assert state.window(SMALL.bucket_ms, T0 + SMALL.bucket_ms).counters.requests == 2
    assert ledger, "a read of the closed minute does not settle the newer one"
    assert state.window(SMALL.bucket_ms, late + SMALL.bucket_ms).counters.requests == 1
    assert not ledger, "a read of the new minute does"
