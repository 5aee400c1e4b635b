"""Hypothesis properties of ``SeriesWindows``: batching does not matter, restore is faithful.

A scaled-down ring (1 s buckets, 2 s lateness, 10 s roll-ups, minute buckets
kept 20 s, hour buckets kept 60 s) lets short generated streams go through
every transition: out-of-order, late, duplicate, close, roll-up and both prunes.
"""

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.streams import AddResult, RingConfig, SeriesWindows

SMALL = RingConfig(
    bucket_ms=1_000,
    rollup_ms=10_000,
    fine_retention_ms=20_000,
    retention_ms=60_000,
    allowed_lateness_ms=2_000,
)
WINDOW_LENGTHS = [1_000, 5_000, 10_000, 30_000, 60_000, 120_000]
T0 = 1_700_000_000_000

MakeEvent = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class New:
    """A new request ``step_ms`` after (or before) the stream's cursor."""

    step_ms: int
    status: str
    ttft_ms: float | None
    output_tokens: int
    gaps: int
    warmup: bool
    flags: int = 0  # cause flags: 1 cache miss, 2 batch wait, 4 throttled
    stages: int = 0  # how many of STAGES the request reports
    prompt: str | None = None  # prompt_version
    traced: bool = True  # has a trace id


STAGES = ("queue", "prefill", "decode")


@dataclass(frozen=True, slots=True)
class Cause:
    """The cache/batch/flow_control sub-records of an event (duck-typed)."""

    prefix_hit_tokens: int = 0
    prefix_query_tokens: int = 0
    wait_ms: float | None = None
    timed_out: bool = False
    throttled: bool = False


def causes(flags: int) -> dict[str, Any]:
    return {
        "cache": Cause(prefix_hit_tokens=10 if flags & 1 else 990, prefix_query_tokens=1000),
        "batch": Cause(wait_ms=350.0 if flags & 2 else 3.0),
        "flow_control": Cause(throttled=bool(flags & 4)),
    }


@dataclass(frozen=True, slots=True)
class Resend:
    """A re-delivery of an earlier request (same event_id, same ts_ms)."""

    which: int


moves = st.lists(
    st.one_of(
        st.builds(
            New,
            step_ms=st.one_of(
                st.integers(min_value=-6_000, max_value=2_500),
                st.integers(min_value=5_000, max_value=70_000),  # a jump: closes, rolls, prunes
            ),
            status=st.sampled_from(["ok", "ok", "ok", "error", "cancelled", "timeout"]),
            ttft_ms=st.none() | st.floats(min_value=1.0, max_value=5_000.0),
            output_tokens=st.integers(min_value=0, max_value=50),
            gaps=st.integers(min_value=0, max_value=4),
            warmup=st.booleans(),
            flags=st.integers(min_value=0, max_value=7),
            stages=st.integers(min_value=0, max_value=len(STAGES)),
            prompt=st.sampled_from([None, "pv-a", "pv-b", "pv-c"]),
            traced=st.booleans(),
        ),
        st.builds(Resend, which=st.integers(min_value=0, max_value=10_000)),
    ),
    min_size=1,
    max_size=80,
)
cuts = st.lists(st.integers(min_value=1, max_value=79), max_size=10)


def stream(plan: list[New | Resend], make_event: MakeEvent) -> list[Any]:
    """Turn a plan into events; every resend repeats an earlier event exactly."""
    events: list[Any] = []
    cursor = T0
    for i, move in enumerate(plan):
        if isinstance(move, Resend):
            if events:
                events.append(events[move.which % len(events)])
            continue
        ts = cursor + move.step_ms
        cursor = max(cursor, ts)
        gaps = [40.0 + 30.0 * g for g in range(move.gaps)]
        events.append(
            make_event(
                ts,
                event_id=f"req-{i}",
                status=move.status,
                e2e_ms=2_000.0 + i,
                ttft_ms=move.ttft_ms,
                output_tokens=move.output_tokens,
                itl_ms=gaps,
                trace_id=f"{i:032x}" if move.traced else None,
                prompt_version=move.prompt,
                warmup=move.warmup,
                stages_ms={name: 10.0 * (i + j) for j, name in enumerate(STAGES[: move.stages])},
                **causes(move.flags),
            )
        )
    return events


def split(events: list[Any], at: list[int]) -> list[list[Any]]:
    bounds = [0, *sorted({c for c in at if 0 < c < len(events)}), len(events)]
    return [events[a:b] for a, b in pairwise(bounds)]


def fingerprint(windows: SeriesWindows) -> dict[str, Any]:
    """Everything observable about a ring, with digests reduced to their sample counts."""

    def bucket_view(tier: dict[int, Any]) -> dict[int, Any]:
        return {
            start: (
                b.counters.as_list(),
                None if b.ids is None else sorted(b.ids),
                sorted(b.exemplars),
                {m: d.n_values for m, d in b.digests.items()},
                {p: (t.requests, t.bad, t.exemplars) for p, t in b.prompts.items()},
            )
            for start, b in tier.items()
        }

    ends: list[int | None] = [None]
    if windows.watermark_ms is not None:
        ends += [windows.watermark_ms - 7_000, windows.watermark_ms + 3_000]
    return {
        "watermark": windows.watermark_ms,
        "late": windows.late,
        "duplicates": windows.duplicates,
        "fine": bucket_view(windows.fine),
        "coarse": bucket_view(windows.coarse),
        "windows": {
            (w, end): (
                windows.counters(w, end).as_list(),
                {m: d.n_values for m, d in windows.window(w, end).digests.items()},
                {
                    p: (t.requests, t.bad, t.exemplars)
                    for p, t in windows.window(w, end).prompts.items()
                },
            )
            for w in WINDOW_LENGTHS
            for end in ends
        },
    }


def totals(results: list[AddResult]) -> tuple[int, int, int, list[int]]:
    return (
        sum(r.accepted for r in results),
        sum(r.late for r in results),
        sum(r.duplicates for r in results),
        [end for r in results for end in r.closed_ends],
    )


@settings(max_examples=150, deadline=None)
@given(plan=moves, at=cuts)
def test_outcome_does_not_depend_on_how_the_events_are_batched(
    make_event: MakeEvent, plan: list[New | Resend], at: list[int]
) -> None:
    events = stream(plan, make_event)
    whole = SeriesWindows(SMALL)
    in_one = totals([whole.add(events)])
    pieces = SeriesWindows(SMALL)
    in_many = totals([pieces.add(batch) for batch in split(events, at)])
    assert in_many == in_one
    assert fingerprint(pieces) == fingerprint(whole)


@settings(max_examples=150, deadline=None)
@given(plan=moves, at=cuts, tail=moves)
def test_restore_from_take_changes_gives_the_same_state(
    make_event: MakeEvent, plan: list[New | Resend], at: list[int], tail: list[New | Resend]
) -> None:
    events = stream(plan + tail, make_event)
    cut = len(stream(plan, make_event))
    head, rest = events[:cut], events[cut:]
    original = SeriesWindows(SMALL)
    store: dict[tuple[str, int], bytes] = {}
    meta = original.take_changes().meta
    for batch in split(head, at):
        original.add(batch)
        changes = original.take_changes()
        store.update(changes.upserts)
        for key in changes.deletes:
            store.pop(key, None)
        meta = changes.meta

    restored = SeriesWindows.restore(meta, lambda tier, start: store.get((tier, start)), SMALL)
    assert fingerprint(restored) == fingerprint(original)
    # The store holds exactly the buckets the state knows: deletes leave nothing behind.
    live = {("m", s) for s in original.fine} | {("h", s) for s in original.coarse}
    assert set(store) == live

    # And the restored ring goes on exactly as the original would.
    assert totals([restored.add(rest)]) == totals([original.add(rest)])
    assert fingerprint(restored) == fingerprint(original)


def contents(windows: SeriesWindows) -> dict[str, Any]:
    """The data a ring holds: bucket counters and digest sizes, and every window's counters.

    Left out on purpose: the open/closed state of buckets, ``late`` and
    ``duplicates`` (see the replay tests in ``test_ring.py``).
    """
    view = fingerprint(windows)
    for tier in ("fine", "coarse"):
        view[tier] = {start: (b[0], b[2], b[3]) for start, b in view[tier].items()}
    del view["late"], view["duplicates"]
    return view


@settings(max_examples=150, deadline=None)
@given(plan=moves, at=cuts, crash=st.randoms(use_true_random=False))
def test_replay_after_a_crash_that_lost_minute_records_converges_to_the_uninterrupted_state(
    make_event: MakeEvent, plan: list[New | Resend], at: list[int], crash: Any
) -> None:
    """Each batch is one input message at offset ``k``; the crash hits message ``k``.

    The meta of message ``k`` reached the store, each of its minute-bucket
    writes and deletes did or did not (hour-bucket losses: ``test_ring.py``).
    Restoring and replaying message ``k`` must give what the ring had without
    the crash.
    """
    batches = split(stream(plan, make_event), at)
    k = crash.randrange(len(batches))
    original = SeriesWindows(SMALL)
    store: dict[tuple[str, int], bytes] = {}
    for offset, batch in enumerate(batches[:k]):
        original.add(batch, positions=[(0, offset)] * len(batch))
        changes = original.take_changes()
        store.update(changes.upserts)
        for key in changes.deletes:
            store.pop(key, None)

    message, positions = batches[k], [(0, k)] * len(batches[k])
    original.add(message, positions=positions)
    changes = original.take_changes()
    for key, data in changes.upserts.items():
        if key[0] == "h" or crash.random() < 0.5:
            store[key] = data
    for key in changes.deletes:
        if crash.random() < 0.5:
            store.pop(key, None)

    restored = SeriesWindows.restore(changes.meta, lambda t, s: store.get((t, s)), SMALL)
    restored.add(message, positions=positions)
    assert contents(restored) == contents(original)


def test_replay_refilling_a_lost_minute_record_keeps_a_request_late_that_was_late(
    make_event: MakeEvent,
) -> None:
    """The shrunk example of the property above (found by Hypothesis).

    One message: eight requests in minute bucket T0, one at T0 + 3 s that
    closes it, then one for T0 that is late. The crash lost bucket T0's record
    (the meta reached the store), so T0 restores empty awaiting its refill: the
    replay must refill it with the eight, not also take the late ninth.
    """
    steps = [0] * 7 + [500, 2_500, -2_001]
    plan: list[New | Resend] = [New(s, "ok", None, 0, 0, warmup=False) for s in steps]
    message = stream(plan, make_event)
    positions = [(0, 0)] * len(message)
    original = SeriesWindows(SMALL)
    first = original.add(message, positions=positions)
    assert (first.accepted, first.late) == (9, 1)
    changes = original.take_changes()
    store = {key: data for key, data in changes.upserts.items() if key != ("m", T0)}

    restored = SeriesWindows.restore(changes.meta, lambda t, s: store.get((t, s)), SMALL)
    again = restored.add(message, positions=positions)
    assert (again.accepted, again.replayed, again.late) == (8, 1, 0)
    assert restored.counters(5_000).requests == original.counters(5_000).requests == 9
    assert contents(restored) == contents(original)


@settings(max_examples=150, deadline=None)
@given(plan=moves, at=cuts)
def test_vectorised_path_equals_the_request_by_request_path_byte_for_byte(
    make_event: MakeEvent, plan: list[New | Resend], at: list[int]
) -> None:
    """Fresh input takes the numpy path; replays take the per-request path. Same result."""
    from tailguard.streams.columns import Columns

    batches = split(stream(plan, make_event), at)
    fast, slow = SeriesWindows(SMALL), SeriesWindows(SMALL)
    fast_closes: list[int] = []
    slow_closes: list[int] = []
    fast_results, slow_results = [], []
    for offset, batch in enumerate(batches):
        cols = Columns.from_events(batch, [(0, offset)] * len(batch))
        assert not batch or fast._is_fresh(cols)
        fast_results.append(fast.add_columns(cols, fast_closes.append))
        slow_results.append(slow._add_replay(cols, slow_closes.append) if batch else AddResult())
    assert totals(fast_results) == totals(slow_results)
    assert fast_closes == slow_closes
    assert fast.take_changes() == slow.take_changes()
    for w in WINDOW_LENGTHS:
        assert fast.window(w).to_bytes() == slow.window(w).to_bytes()


@settings(max_examples=100, deadline=None)
@given(
    plans=st.lists(moves, min_size=1, max_size=4),
    at=cuts,
    replay=st.lists(st.integers(min_value=0, max_value=40), max_size=3),
)
def test_folding_many_series_at_once_equals_folding_each_alone(
    make_event: MakeEvent,
    plans: list[list[New | Resend]],
    at: list[int],
    replay: list[int],
) -> None:
    """``fold_many`` (one numpy pass over a batch of series) == ``add_columns`` per series.

    Batch ``k`` is input message ``k`` of partition 0 and holds a slice of
    every series; some batches are delivered twice (a replay after a crash),
    which sends those series down the request-by-request path.
    """
    from tailguard.streams.columns import Columns
    from tailguard.streams.fold import fold_many

    per_series = [split(stream(plan, make_event), at) for plan in plans]
    n_batches = max(len(b) for b in per_series)
    deliveries = list(range(n_batches))
    for r in replay:
        if n_batches:
            k = r % n_batches
            deliveries.insert(deliveries.index(k) + 1, k)
    alone = [SeriesWindows(SMALL) for _ in plans]
    together = [SeriesWindows(SMALL) for _ in plans]
    closes_alone: list[list[int]] = [[] for _ in plans]
    closes_together: list[list[int]] = [[] for _ in plans]
    for k in deliveries:
        groups = [batches[k] if k < len(batches) else [] for batches in per_series]
        expected = []
        for i, events in enumerate(groups):
            if events:
                cols = Columns.from_events(events, [(0, k)] * len(events))
                expected.append(alone[i].add_columns(cols, closes_alone[i].append))
            else:
                expected.append(AddResult())
        flat = [e for events in groups for e in events]
        if not flat:
            continue
        cols = Columns.from_events(flat, [(0, k)] * len(flat))
        bounds = [0]
        for events in groups:
            bounds.append(bounds[-1] + len(events))
        got = fold_many(together, cols, bounds, [c.append for c in closes_together])
        assert [totals([r]) for r in got] == [totals([r]) for r in expected]
    assert closes_together == closes_alone
    for a, b in zip(alone, together, strict=True):
        assert a.take_changes() == b.take_changes()
        for w in WINDOW_LENGTHS:
            assert a.window(w).to_bytes() == b.window(w).to_bytes()
