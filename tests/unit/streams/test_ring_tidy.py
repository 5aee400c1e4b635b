"""Closes read after the fold (``tidy_after``) see what closes read inline did.

The worker notes the minutes a fold closes and reads them all once the fold is
done, with roll-ups and pruning held until then. Generated streams (the
scaled-down ring of the batching properties: closes, roll-ups and both prunes
within seconds) are folded twice, reading every closed end inline and after
the fold; the reads and the final state must agree.
"""

from typing import Any

from hypothesis import given, settings
from tailguard.streams import SeriesWindows
from tailguard.streams.fold import tidy_after

from tests.unit.streams.test_ring_properties import (
    SMALL,
    WINDOW_LENGTHS,
    MakeEvent,
    New,
    Resend,
    cuts,
    fingerprint,
    moves,
    split,
    stream,
)

QS = [0.5, 0.9, 0.99]


def read(ring: SeriesWindows, end: int) -> dict[int, Any]:
    """What a close reads of the windows ending at ``end``: counters and exemplars of
    every window; digests of those up to an hour (the ring's roll-up period), the
    windows a close merges."""
    out: dict[int, Any] = {}
    for w in WINDOW_LENGTHS:
        view: list[Any] = [ring.counters(w, end).as_list(), ring.exemplars(w, end)]
        if w <= SMALL.rollup_ms:
            merged = ring.window(w, end)
            view.append({m: d.quantiles(QS) for m, d in sorted(merged.digests.items())})
        out[w] = view
    ring.release_window_cache()
    return out


def run(deliveries: list[tuple[int, list[Any]]], *, after: bool) -> tuple[list[Any], Any]:
    """Fold each ``(message, requests)`` delivery; read every closed end inline or
    after the fold. Returns the reads and the ring's final fingerprint."""
    ring = SeriesWindows(SMALL)
    seen: list[Any] = []
    for i, piece in deliveries:
        where = [(0, i)] * len(piece) if i >= 0 else None
        if after:
            ends: list[int] = []
            with tidy_after([ring]):
                ring.add(piece, where, on_close=ends.append)
                seen.extend((end, read(ring, end)) for end in ends)
        else:
            ring.add(piece, where, on_close=lambda end: seen.append((end, read(ring, end))))
    return seen, fingerprint(ring)


@settings(max_examples=150, deadline=None)
@given(plan=moves, at=cuts)
def test_a_close_read_after_the_fold_sees_what_it_saw_inline(
    make_event: MakeEvent, plan: list[New | Resend], at: list[int]
) -> None:
    pieces = split(stream(plan, make_event), at)
    deliveries = [(-1, piece) for piece in pieces]  # no input positions
    assert run(deliveries, after=True) == run(deliveries, after=False)


@settings(max_examples=100, deadline=None)
@given(plan=moves, at=cuts)
def test_replayed_input_closes_alike_read_inline_or_after_the_fold(
    make_event: MakeEvent, plan: list[New | Resend], at: list[int]
) -> None:
    """Each piece is an input message; every other one is delivered twice (the
    request-by-request replay path)."""
    pieces = split(stream(plan, make_event), at)
    delivered = [(i, p) for i, p in enumerate(pieces) for _ in range(2 if i % 2 else 1)]
    assert run(delivered, after=True) == run(delivered, after=False)
