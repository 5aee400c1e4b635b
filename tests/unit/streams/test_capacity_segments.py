"""The open load intervals' values are stored once, in segments: a deployment saved
after every message restores to the same values in the same order, and what it
writes grows with the values, not with the values times the messages."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.streams.capacity import LoadWindow
from tailguard.streams.capacity_state import (
    MAX_SEGMENTS,
    CoreState,
    decode_core,
    encode_core,
    restore_segments,
    segment_changes,
)
from tailguard.streams.errors import CorruptStateError
from tailguard.streams.knee import KneeConfig, KneeTracker

KNEE = KneeConfig()


class Agent:
    """The capacity agent's save and load of one deployment, over a dict table."""

    def __init__(self) -> None:
        self.core = CoreState(LoadWindow(), KneeTracker(KNEE))
        self.table: dict[str, bytes] = {}
        self.written = 0
        self.closed: list[tuple[int, float, float, int]] = []

    def feed(self, ts: np.ndarray, e2e: np.ndarray, tokens: np.ndarray) -> None:
        for _, load in self.core.load.add_many(ts, e2e, tokens):
            s = load.sample
            self.closed.append((load.end_ms, s.concurrency, s.p95_ms, load.requests))

    def save(self) -> None:
        segment, done = segment_changes(self.core)
        if segment is not None:
            number, data = segment
            self.put(f"O{number}", data)
        self.put("C", encode_core(self.core))
        for number in done:
            del self.table[f"O{number}"]

    def put(self, key: str, data: bytes) -> None:
        self.table[key] = data
        self.written += len(data)

    def restarted(self) -> "Agent":
        back = Agent()
        back.table = dict(self.table)
        back.closed = list(self.closed)
        if "C" not in self.table:
            return back  # never saved: a new deployment
        core = decode_core(
            self.table["C"], interval_ms=10_000, grace_ms=2_000, knee=KNEE, warmup_after=20
        )
        restore_segments(core, [self.table[f"O{n}"] for n, _ in core.segments])
        back.core = core
        return back


def messages(seed: int, n_messages: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Requests in event-time order, cut into messages of random sizes."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 120, n_messages)
    ts = np.sort(rng.integers(0, 60_000, int(sizes.sum()))).astype(np.int64)
    e2e = rng.lognormal(6.0, 0.5, ts.size).round(2)
    tokens = rng.integers(1, 400, ts.size).astype(np.int64)
    cuts = np.r_[0, np.cumsum(sizes)]
    return [(ts[a:b], e2e[a:b], tokens[a:b]) for a, b in itertools.pairwise(cuts)]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), restarts=st.sets(st.integers(0, 39), max_size=6))
def test_a_deployment_restarted_anywhere_closes_the_same_intervals(
    seed: int, restarts: set[int]
) -> None:
    whole, cut = Agent(), Agent()
    for i, message in enumerate(messages(seed, 40)):
        whole.feed(*message)
        whole.save()
        if i in restarts:
            cut = cut.restarted()
        cut.feed(*message)
        cut.save()
        for slot in cut.core.load.open.values():
            assert slot.saved == len(slot.e2e)
    # The same intervals closed with the same figures, to the bit (sums in the same order).
    assert cut.closed == whole.closed and whole.closed
    assert cut.table == whole.table
    back = cut.restarted()
    assert {s: v.e2e for s, v in back.core.load.open.items()} == {
        s: v.e2e for s, v in whole.core.load.open.items()
    }


def test_a_segment_leaves_the_table_once_its_intervals_closed() -> None:
    agent = Agent()
    for message in messages(3, 40):
        agent.feed(*message)
        agent.save()
    listed = {f"O{n}" for n, _ in agent.core.segments}
    assert {k for k in agent.table if k.startswith("O")} == listed
    newest = [newest for _, newest in agent.core.segments]
    assert all(start > agent.core.load.closed_through for start in newest)


def test_saving_after_every_message_writes_each_value_once() -> None:
    """One interval of 4,000 requests saved after each of 200 messages: the cores
    stay small and every value is written a few times (a core holding every value
    of the open interval would write ~100 times as much)."""
    agent = Agent()
    ts = np.arange(4_000, dtype=np.int64)  # 4 s of one 10 s interval: it never closes
    e2e = np.full(4_000, 512.25)
    tokens = np.full(4_000, 3, dtype=np.int64)
    core_sizes = []
    for lo in range(0, 4_000, 20):
        agent.feed(ts[lo : lo + 20], e2e[lo : lo + 20], tokens[lo : lo + 20])
        agent.save()
        core_sizes.append(len(agent.table["C"]))
        # Restarted here, before or after segments were replaced, it holds every value.
        (slot,) = agent.restarted().core.load.open.values()
        assert slot.e2e == e2e[: lo + 20].tolist()
    assert max(core_sizes) < 150 + 8 * MAX_SEGMENTS  # the segments listed, bounded
    assert len(agent.core.segments) <= MAX_SEGMENTS
    values_bytes = 4_000 * 9  # a msgpack float64
    # Rewritten whole every MAX_SEGMENTS messages: 200 / 32 ≈ 6 times half the values.
    assert agent.written < 6 * values_bytes


def test_bytes_of_a_segment_that_do_not_decode_are_refused() -> None:
    agent = Agent()
    agent.feed(*messages(1, 1)[0])
    agent.save()
    with pytest.raises(CorruptStateError, match="segment"):
        restore_segments(agent.core, [b"\x00not a segment"])
