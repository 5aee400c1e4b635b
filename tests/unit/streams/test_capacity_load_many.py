"""A load window fed a batch at once closes what it closes fed request by request."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.streams.capacity import LoadWindow


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.integers(-6_000, 9_000), max_size=60),
    grace=st.integers(0, 5_000),
    cut=st.integers(0, 60),
)
def test_a_batch_closes_the_intervals_its_requests_close_one_by_one(
    steps: list[int], grace: int, cut: int
) -> None:
    ts = np.abs(40_000 + np.cumsum(np.array(steps, dtype=np.int64)))  # late ones included
    e2e = np.arange(len(ts), dtype=np.float64) * 7.5 + 1
    tokens = np.arange(len(ts), dtype=np.int64) % 9
    one, many = LoadWindow(10_000, grace), LoadWindow(10_000, grace)
    expected = [
        (i, closed)
        for i in range(len(ts))
        for closed in one.add(int(ts[i]), float(e2e[i]), int(tokens[i]))
    ]
    # In two batches: the window carries what is open from one to the next.
    cut = min(cut, len(ts))
    got = many.add_many(ts[:cut], e2e[:cut], tokens[:cut])
    got += [(cut + i, c) for i, c in many.add_many(ts[cut:], e2e[cut:], tokens[cut:])]
    assert got == expected
    assert (many.open, many.late, many.closed_through) == (one.open, one.late, one.closed_through)
