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
