"""Per-instance KV state: exact figures, minute history, replay idempotence, bytes."""

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tailguard.streams.errors import ConfigError, CorruptStateError
from tailguard.streams.kv import (
    MINUTE_MS,
    KvMinute,
    KvState,
    decode_minute,
    encode_minute,
    figures,
    fragmentation,
)

T0_MS = 1_699_995_600_000


@dataclass(frozen=True, slots=True)
class Seq:
    tenant: str
    tokens: int
    blocks: int


@dataclass(frozen=True, slots=True)
class Snap:
    ts_ms: int
    instance: str = "inst-0"
    block_size: int = 16
    total_blocks: int = 100
    free_blocks: int = 60
    preemptions: int | None = 0
    host: str | None = "gpu-node-01"
    sequences: list[Seq] = field(default_factory=list)


def snap(ts_ms: int, *seqs: tuple[str, int, int], **kw: object) -> Snap:
    return Snap(ts_ms, sequences=[Seq(*s) for s in seqs], **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seqs", "block_size", "expected"),
    [
        # 1 − 30 / (2·16) = 0.0625
        ([("a", 30, 2)], 16, 1 - 30 / 32),
        # 1 − (30 + 10) / ((2 + 1)·16) = 1 − 40/48
        ([("a", 30, 2), ("b", 10, 1)], 16, 1 - 40 / 48),
        # full blocks: no fragmentation
        ([("a", 64, 4), ("b", 16, 1)], 16, 0.0),
        # the article's 0.37 by hand: 1008 tokens in 100 blocks of 16 → 1 − 1008/1600
        ([("a", 500, 50), ("b", 508, 50)], 16, 1 - 1008 / 1600),
    ],
)
def test_fragmentation_is_one_minus_tokens_over_block_capacity(
    seqs: list[tuple[str, int, int]], block_size: int, expected: float
) -> None:
    f = figures(snap(T0_MS, *seqs, block_size=block_size))
    assert f.fragmentation == pytest.approx(expected, abs=0)
    assert f.fragmentation == 1.0 - f.tokens / (f.blocks * block_size)


def test_no_sequences_means_no_fragmentation_figure() -> None:
    assert figures(snap(T0_MS)).fragmentation is None
    assert fragmentation(0, 0) is None


def test_utilisation_pressure_and_tenant_shares_are_exact() -> None:
    f = figures(
        snap(
            T0_MS,
            ("acme", 30, 2),
            ("acme", 10, 1),
            ("globex", 16, 1),
            free_blocks=2,
            total_blocks=8,
        )
    )
    assert f.utilisation == 1 - 2 / 8
    # three sequences, two free blocks: one would be preempted if each needed a block
    assert f.free_block_pressure == 1 / 3
    assert f.tenants["acme"].sequences == 2 and f.tenants["acme"].tokens == 40
    assert f.token_share("acme") == 40 / 56 and f.block_share("globex") == 1 / 4
    assert f.token_share("initech") == 0.0


def test_preemption_rate_comes_from_counter_deltas_and_survives_a_reset() -> None:
    state = KvState("inst-0")
    state.apply(snap(T0_MS, preemptions=10))
    state.apply(snap(T0_MS + 5_000, preemptions=20))
    assert state.latest is not None and state.latest.preemption_rate == 2.0
    state.apply(snap(T0_MS + 10_000, preemptions=3))  # the server restarted
    assert state.latest.preemption_rate == 3 / 5


def test_minutes_are_sums_of_their_snapshots_and_close_when_a_later_minute_starts() -> None:
    state = KvState("inst-0")
    a = snap(T0_MS + 1_000, ("acme", 30, 2))
    b = snap(T0_MS + 31_000, ("acme", 40, 3), ("globex", 7, 1), free_blocks=50)
    c = snap(T0_MS + MINUTE_MS + 1_000, ("globex", 10, 1))
    assert state.apply(a).closed == [] and state.apply(b).closed == []
    closed = state.apply(c).closed
    assert len(closed) == 1
    m = closed[0]
    assert m.end_ms == T0_MS + MINUTE_MS and m.snapshots == 2
    assert (m.tokens, m.block_tokens) == (30 + 40 + 7, (2 + 3 + 1) * 16)
    assert m.fragmentation == 1 - 77 / 96
    assert m.utilisation == (40 + 50) / 200
    assert m.tenants["acme"].tokens == 70 and m.token_share("globex") == 7 / 77
    assert [x.end_ms for x in state.history()] == [T0_MS + MINUTE_MS, T0_MS + 2 * MINUTE_MS]


def test_a_replayed_or_older_snapshot_changes_nothing() -> None:
    state = KvState("inst-0")
    snaps = [snap(T0_MS + i * 5_000, ("acme", 10 + i, 2)) for i in range(30)]
    state.apply_all(snaps)
    before = state.to_bytes()
    results = state.apply_all([*snaps[5:], snaps[-1]])
    assert not any(r.accepted for r in results)
    assert state.to_bytes() == before


def test_history_is_bounded_in_event_time() -> None:
    state = KvState("inst-0", history_minutes=5)
    for i in range(20):
        state.apply(snap(T0_MS + i * MINUTE_MS, ("acme", 10, 1)))
    assert len(state.minutes) <= 5
    assert state.minutes[-1].end_ms == T0_MS + 19 * MINUTE_MS


def test_a_snapshot_of_another_instance_is_refused() -> None:
    with pytest.raises(ConfigError, match="instance"):
        KvState("inst-0").apply(Snap(T0_MS, instance="inst-9"))


def test_corrupt_bytes_say_what_to_do() -> None:
    with pytest.raises(CorruptStateError, match="changelog"):
        KvState.from_bytes(b"\x01\x02")


_seq = st.tuples(
    st.sampled_from(["acme", "globex", "initech"]),
    st.integers(0, 4000),
    st.integers(0, 300),
)


@given(st.lists(st.tuples(st.integers(0, 600_000), st.lists(_seq, max_size=6)), max_size=40))
def test_serialise_then_restore_is_identity_and_replay_is_idempotent(
    items: list[tuple[int, list[tuple[str, int, int]]]],
) -> None:
    state = KvState("inst-0")
    snaps = [snap(T0_MS + ts, *seqs, preemptions=i) for i, (ts, seqs) in enumerate(items)]
    state.apply_all(snaps)
    data = state.to_bytes()
    restored = KvState.from_bytes(data)
    assert restored.to_bytes() == data
    restored.apply_all(snaps)
    assert restored.to_bytes() == data
    for m in state.history():
        assert decode_minute(encode_minute(m)) == m


def test_minute_wire_round_trips() -> None:
    m = KvMinute(end_ms=T0_MS, snapshots=1, tokens=5, block_tokens=16, tenants={})
    assert decode_minute(encode_minute(m)) == m
    with pytest.raises(CorruptStateError):
        decode_minute(b"\xff")
