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
from tailguard.streams.replay import add_replay

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


def in_messages(events: list[Any], size: int) -> list[list[Any]]:
    """Input messages of ``size`` requests each (the last one may hold fewer)."""
    return [events[i : i + size] for i in range(0, len(events), size)]


def fingerprint(windows: SeriesWindows) -> dict[str, Any]:
    """Everything observable about a ring, with digests reduced to their sample counts."""
    windows.settle()  # buckets read directly below (windows and counters settle themselves)

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
@given(plan=moves, at=cuts, picked=st.lists(st.sampled_from(WINDOW_LENGTHS), max_size=6))
def test_windows_counted_together_are_counted_as_each_alone(
    make_event: MakeEvent, plan: list[New | Resend], at: list[int], picked: list[int]
) -> None:
    windows = SeriesWindows(SMALL)
    for batch in split(stream(plan, make_event), at):
        windows.add(batch)
        if windows.watermark_ms is None:
            continue
        for end in (windows.watermark_ms - 7_000, windows.watermark_ms, windows.default_end()):
            assert end is not None
            together = windows.counters_many(picked, end)
            assert [c.as_list() for c in together] == [
                windows.counters(w, end).as_list() for w in picked
            ]


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

    restored = SeriesWindows.restore(meta, store.get, SMALL)
    assert fingerprint(restored) == fingerprint(original)
    # The store holds exactly the records the state knows (each bucket whole, and an
    # open one's segments since): deletes leave nothing behind.
    live: set[tuple[Any, ...]] = {("h", s) for s in original.coarse}
    for s, b in original.fine.items():
        live |= {("m", s)} | {("m", s, v) for v in range(b.base + 1, b.version + 1)}
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

    restored = SeriesWindows.restore(changes.meta, store.get, SMALL)
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

    restored = SeriesWindows.restore(changes.meta, store.get, SMALL)
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
        # Fresh, save the first input: a partition feeding a series for the first
        # time takes the request-by-request path.
        assert not batch or fast._is_fresh(cols) or not fast.feeders
        fast_results.append(fast.add_columns(cols, fast_closes.append))
        slow_results.append(add_replay(slow, cols, slow_closes.append) if batch else AddResult())
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
    which sends those series down the request-by-request path. Every batch of
    ``together`` goes into one ledger, settled for all series at once at the
    first read (the worker's way); each series ``alone`` settles its own.
    """
    from tailguard.streams.columns import Columns
    from tailguard.streams.fold import fold_many
    from tailguard.streams.fold_batch import Ledger

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
    ledger = Ledger()
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
        got = fold_many(together, cols, bounds, [c.append for c in closes_together], ledger)
        assert [totals([r]) for r in got] == [totals([r]) for r in expected]
    assert closes_together == closes_alone
    for a, b in zip(alone, together, strict=True):
        assert a.take_changes() == b.take_changes()
        for w in WINDOW_LENGTHS:
            assert a.window(w).to_bytes() == b.window(w).to_bytes()


@settings(max_examples=400, deadline=None)
@given(plan=moves, size=st.integers(1, 6), crash=st.randoms(use_true_random=False))
def test_any_restore_a_kill_can_leave_then_a_replay_from_the_commit_converges(
    make_event: MakeEvent, plan: list[New | Resend], size: int, crash: Any
) -> None:
    """The worker's real failure model, per table (meta; buckets).

    Each batch is one input message at offset ``k``. A checkpoint (after some
    messages) writes the changed buckets, then, once a flush has delivered them,
    the meta, then, after another flush, deletes the pruned buckets (as
    ``SeriesStore.checkpoint`` does); a commit (after some
    checkpoint) has every write up to it on the changelog. A SIGKILL stops the
    writes anywhere after the commit. Per table, independently, the changelog
    holds a prefix of the writes (at least up to the commit) and the local store
    remembers an earlier changelog position; restarting re-applies the changelog
    from there over the local store. So each key comes back as its last local
    write, or as its last delivered write after the remembered position.
    Restoring that and replaying every message after the commit must give what
    the ring had without the crash. Or another worker takes the partition over
    and restores from the changelog alone.
    """
    batches = in_messages(stream(plan, make_event), size)
    n = len(batches)
    original = SeriesWindows(SMALL)
    log: list[tuple[str, Any, bytes | None]] = []  # (table, key, value or None: deleted)
    checkpoints: list[tuple[int, int]] = []  # (last message, writes so far)
    flushes: list[int] = [0]  # writes so far at each flush
    for offset, batch in enumerate(batches):
        original.add(batch, positions=[(0, offset)] * len(batch))
        if offset == n - 1 or crash.random() < 0.5:
            changes = original.take_changes()
            log += [("b", key, data) for key, data in changes.upserts.items()]
            flushes.append(len(log))  # the meta goes only once its buckets are delivered
            log.append(("m", "meta", changes.meta))
            if changes.deletes:  # and pruned records only once the meta is
                flushes.append(len(log))
                log += [("b", key, None) for key in changes.deletes]
            checkpoints.append((offset, len(log)))
    which = crash.randrange(-1, len(checkpoints))
    committed, durable = checkpoints[which] if which >= 0 else (-1, 0)
    written = crash.randint(durable, len(log))
    flushed = max(durable, max(f for f in flushes if f <= written))
    store: dict[Any, bytes | None] = {}
    elsewhere = crash.random() < 0.3  # another worker takes over: no local store
    for table in ("b", "m"):
        delivered = crash.randint(flushed, written)
        remembered = 0 if elsewhere else crash.randint(0, delivered)
        for t, key, value in [*([] if elsewhere else log[:written]), *log[remembered:delivered]]:
            if t == table:
                store[key] = value
    meta = store.get("meta")
    if meta is None:
        restored = SeriesWindows(SMALL)
    else:
        restored = SeriesWindows.restore(meta, store.get, SMALL)
    for offset in range(committed + 1, n):
        restored.add(batches[offset], positions=[(0, offset)] * len(batches[offset]))
    assert contents(restored) == contents(original)


class _Table:
    """One faust table partition as a SIGKILL sees it: a local store written at once,
    a changelog that gets what the producer delivered, and the changelog position
    the local store remembers (faust's persisted offset, written by the delivery
    callback, so it may lag)."""

    def __init__(self) -> None:
        self.local: dict[Any, bytes | None] = {}
        self.changelog: list[tuple[Any, bytes | None]] = []
        self.pending: list[tuple[Any, bytes | None]] = []
        self.remembered = 0

    def write(self, key: Any, value: bytes | None) -> None:
        self.local[key] = value
        self.pending.append((key, value))

    def deliver(self, how_many: int, remember: bool) -> None:
        self.changelog += self.pending[:how_many]
        del self.pending[:how_many]
        if remember:
            self.remembered = len(self.changelog)

    def kill_and_recover(self, rng: Any, elsewhere: bool) -> None:
        """Some of what was sent still reaches the broker; the rest is gone. Restarting
        re-applies the changelog from the remembered position over the local store;
        another worker (``elsewhere``) has no local store and reads it all."""
        self.deliver(rng.randint(0, len(self.pending)), remember=False)
        self.pending.clear()
        if elsewhere:
            self.local, self.remembered = {}, 0
        else:
            self.remembered = rng.randint(self.remembered, len(self.changelog))
        for key, value in self.changelog[self.remembered :]:
            self.local[key] = value
        self.remembered = len(self.changelog)


@settings(max_examples=300, deadline=None)
@given(plan=moves, size=st.integers(1, 6), crash=st.randoms(use_true_random=False))
def test_several_kills_with_torn_changelogs_still_converge(
    make_event: MakeEvent, plan: list[New | Resend], size: int, crash: Any
) -> None:
    """Like the test above, with repeated kills, some during the replay of the last one,
    some in the middle of a checkpoint, and deliveries and commits at random."""
    batches = in_messages(stream(plan, make_event), size)
    n = len(batches)
    original = SeriesWindows(SMALL)
    for offset, batch in enumerate(batches):
        original.add(batch, positions=[(0, offset)] * len(batch))

    meta, buckets = _Table(), _Table()
    state = SeriesWindows(SMALL)
    committed = acked = -1
    offset = 0
    kills = 0
    while offset < n:
        batch = batches[offset]
        state.add(batch, positions=[(0, offset)] * len(batch))
        killed = False
        if offset == n - 1 or crash.random() < 0.5:  # checkpoint: buckets, then the meta
            changes = state.take_changes()
            writes: list[tuple[_Table, Any, bytes | None] | None] = [
                (buckets, key, data) for key, data in changes.upserts.items()
            ]
            writes += [None, (meta, "meta", changes.meta)]  # the meta after its buckets
            if changes.deletes:  # pruned records go only once the meta is delivered
                writes.append(None)
                writes += [(buckets, key, None) for key in changes.deletes]
            for write in writes:
                if kills < 4 and crash.random() < 0.1:
                    killed = True
                    break
                if write is None:
                    for table in (meta, buckets):
                        table.deliver(len(table.pending), remember=crash.random() < 0.5)
                else:
                    write[0].write(write[1], write[2])
            else:
                acked = offset
        for table in (meta, buckets):
            if table.pending and crash.random() < 0.3:
                table.deliver(crash.randint(1, len(table.pending)), crash.random() < 0.5)
        if not killed and crash.random() < 0.3:  # commit: flush, then the input offset
            for table in (meta, buckets):
                table.deliver(len(table.pending), remember=crash.random() < 0.8)
            committed = acked
        if not killed and kills < 4 and crash.random() < 0.25:
            killed = True
        if killed:
            kills += 1
            elsewhere = crash.random() < 0.3
            for table in (meta, buckets):
                table.kill_and_recover(crash, elsewhere)
            stored = meta.local.get("meta")
            if stored is None:
                state = SeriesWindows(SMALL)
            else:
                state = SeriesWindows.restore(stored, buckets.local.get, SMALL)
            offset = acked = committed
            offset += 1
            continue
        offset += 1
    assert contents(state) == contents(original)
