"""A minute's exemplars are its slowest traced requests, however the minute arrives in batches."""

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.streams import SeriesWindows
from tailguard.streams.bucket import EXEMPLARS

from tests.unit.streams.conftest import T0_MS, Event


@settings(max_examples=200, deadline=None)
@given(
    # Few distinct E2E values, so ties with the kept exemplars are common.
    e2e=st.lists(st.sampled_from([100.0, 200.0, 300.0, 400.0, 500.0]), min_size=1, max_size=40),
    traced=st.lists(st.booleans(), min_size=40, max_size=40),
    cuts=st.lists(st.integers(1, 39), max_size=6),
)
def test_exemplars_are_the_slowest_traced_requests_of_the_minute(
    e2e: list[float], traced: list[bool], cuts: list[int]
) -> None:
    events = [
        Event(
            f"e{i}",
            T0_MS + i * 100,
            e2e_ms=value,
            ttft_ms=50.0,
            trace_id=f"{i:032x}" if traced[i] else None,
        )
        for i, value in enumerate(e2e)
    ]
    state = SeriesWindows()
    bounds = [0, *sorted({c for c in cuts if c < len(events)}), len(events)]
    for a, b in pairwise(bounds):
        if b > a:
            state.add(events[a:b])
    state.settle()
    (bucket,) = state.fine.values()
    expected = sorted(
        ((ev.e2e_ms, ev.trace_id) for ev in events if ev.trace_id is not None), reverse=True
    )[:EXEMPLARS]
    assert bucket.exemplars == expected
