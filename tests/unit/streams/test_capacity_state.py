"""The capacity state restores to bytes and back: a restored deployment decides as before."""

from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from tailguard.streams.breaker import BreakerPolicy, ExpertBreakers
from tailguard.streams.capacity import LoadWindow, ScalePolicy, WarmupTracker, decide
from tailguard.streams.capacity_state import (
    CoreState,
    decode_core,
    decode_experts,
    decode_knee,
    decode_rag,
    encode_core,
    encode_experts,
    encode_knee,
    encode_rag,
)
from tailguard.streams.errors import CorruptStateError
from tailguard.streams.knee import KneeConfig, KneeTracker
from tailguard.streams.rag import RagConfig, RagThreshold

from tailguard.simulator import capacity as cap

KNEE_CFG = KneeConfig()


@dataclass
class Replay:
    """The capacity agent's per-deployment loop without Kafka (what ``absorb`` does)."""

    core: CoreState = field(
        default_factory=lambda: CoreState(
            LoadWindow(), KneeTracker(KNEE_CFG), warmup=WarmupTracker(20)
        )
    )
    experts: ExpertBreakers = field(default_factory=ExpertBreakers)
    rag: RagThreshold = field(default_factory=RagThreshold)
    out: list[tuple[Any, ...]] = field(default_factory=list)

    def feed(self, e: dict[str, Any]) -> None:
        core = self.core
        report = core.warmup.add(e["instance"], bool(e.get("warmup")), e["ttft_ms"])
        if report is not None:
            self.out.append(("warmup", report.evidence()["after_ttft_p50_ms"]))
        ok = e["status"] == "ok"
        for t in self.experts.observe(e.get("expert_ids", []), ok, e["e2e_ms"], e["ts_ms"]):
            self.out.append(("breaker", t.expert, t.before, t.after, t.ts_ms))
        if e.get("rag_top1_similarity") is not None:
            change = self.rag.add(e["rag_top1_similarity"])
            if change is not None:
                self.out.append(("rag", change["threshold"]))
        if e.get("warmup"):
            return
        for closed in core.load.add(e["ts_ms"], e["e2e_ms"], e["output_tokens"]):
            knee = core.knee.add(closed.sample)
            if knee is not None:
                self.out.append(("knee", knee.concurrency))
            d = decide(
                ScalePolicy(),
                core.scale,
                ts_ms=closed.end_ms,
                concurrency=closed.sample.concurrency,
                knee=core.knee.published,
                util_pct=20.0,
                mem_fraction=0.5,
            )
            self.out.append(("scale", closed.end_ms, d.decision, d.reason))

    def restored(self) -> "Replay":
        """A new replay from the bytes of this one (what a restarted worker reads)."""
        core = decode_core(
            encode_core(self.core),
            interval_ms=self.core.load.interval_ms,
            grace_ms=self.core.load.grace_ms,
            knee=KNEE_CFG,
            warmup_after=20,
        )
        experts = decode_experts(encode_experts(self.experts), BreakerPolicy())
        rag = decode_rag(encode_rag(self.rag), RagConfig())
        return Replay(core, experts, rag, list(self.out))

    def restored_split(self, core: bytes | None = None) -> "Replay":
        """As the agent stores it: the core without the history, the knee apart.

        ``core``: an older core record (a crash after the knee write, before the
        core write of the same message)."""
        back = self.restored()
        back.core = decode_core(
            core if core is not None else encode_core(self.core, history=False),
            interval_ms=self.core.load.interval_ms,
            grace_ms=self.core.load.grace_ms,
            knee=KNEE_CFG,
            warmup_after=20,
        )
        back.core.knee = decode_knee(encode_knee(self.core.knee), KNEE_CFG)
        return back


def scenario_events() -> list[dict[str, Any]]:
    events = [e for evs in cap.capacity_scenarios(0).values() for e in evs]
    return sorted(events, key=lambda e: e["ts_ms"])


@pytest.mark.parametrize("split", [False, True], ids=["whole", "core+knee"])
@pytest.mark.parametrize("cuts", [(150, 900), (1_000, 2_400, 4_100), (3_000,), (5_200, 6_000)])
def test_a_state_restored_at_any_point_decides_like_the_uninterrupted_one(
    cuts: tuple[int, ...], split: bool
) -> None:
    """``split``: restored as the agent stores it, the knee history apart from the core."""
    events = scenario_events()
    whole = Replay()
    for e in events:
        whole.feed(e)
    # Sanity: the run has what the restart could lose — a knee, an episode, breaker
    # moves and thresholds.
    kinds = {o[0] for o in whole.out}
    assert {"knee", "scale", "breaker", "rag", "warmup"} <= kinds
    cut = Replay()
    for i, e in enumerate(events):
        if i in cuts:
            cut = cut.restored_split() if split else cut.restored()
        cut.feed(e)
    assert cut.out == whole.out
    assert encode_core(cut.core) == encode_core(whole.core)


def test_a_crash_between_the_knee_and_core_writes_replays_to_the_same_state() -> None:
    events = scenario_events()
    whole = Replay()
    for e in events:
        whole.feed(e)
    closes = 0
    r = Replay()
    for i, e in enumerate(events):
        before = encode_core(r.core, history=False)  # the last core written
        n, m = len(r.core.knee.samples), len(r.out)
        r.feed(e)
        if len(r.core.knee.samples) > n and i > 1_000 and closes < 5:
            # This event closed an interval: the knee record has it, the core does not.
            closes += 1
            first = r.out[m:]
            published = list(r.out)
            r = r.restored_split(core=before)
            r.out = list(published)
            r.feed(e)  # the replay of the message
            # The same records again (the agent re-sends them with the same event
            # ids), except a knee published the first time: the history has it.
            assert r.out[len(published) :] == [o for o in first if o[0] != "knee"]
            del r.out[len(published) :]
    assert closes == 5
    assert encode_core(r.core) == encode_core(whole.core)
    assert r.out == whole.out


def test_the_bytes_round_trip_keeps_every_field() -> None:
    r = Replay()
    for e in scenario_events()[:3_000]:
        r.feed(e)
    back = r.restored()
    assert encode_core(back.core) == encode_core(r.core)
    assert encode_experts(back.experts) == encode_experts(r.experts)
    assert encode_rag(back.rag) == encode_rag(r.rag)
    assert back.core.scale == r.core.scale and back.core.knee.published == r.core.knee.published
    assert {e: b.state for e, b in back.experts.breakers.items()} == {
        e: b.state for e, b in r.experts.breakers.items()
    }
    assert all(
        (b.errors, b.slow) == (r.experts.breakers[e].errors, r.experts.breakers[e].slow)
        for e, b in back.experts.breakers.items()
    )


@pytest.mark.parametrize(
    ("decode", "data"),
    [
        (lambda d: decode_rag(d, RagConfig()), b"\x00garbage"),
        (lambda d: decode_experts(d, BreakerPolicy()), msgspec.msgpack.encode([99, [], []])),
        (lambda d: decode_rag(d, RagConfig()), msgspec.msgpack.encode([2, [0.5], None, 0, 0])),
    ],
)
def test_bytes_that_do_not_restore_are_refused_with_a_reason(decode: Any, data: bytes) -> None:
    with pytest.raises(CorruptStateError, match="capacity"):
        decode(data)


def test_core_state_saved_before_knee_confirmation_restores() -> None:
    # A worker from before the knee's confirmation window wrote two fields fewer
    # (the knee's recent candidates, and the input marks that came after them).
    r = Replay()
    for e in scenario_events():
        r.feed(e)
    assert r.core.knee.published is not None
    # (and the segments, two fields more, that came after both)
    older = msgspec.msgpack.encode(msgspec.msgpack.decode(encode_core(r.core))[:-4])
    back = decode_core(older, interval_ms=10_000, grace_ms=2_000, knee=KNEE_CFG, warmup_after=20)
    assert back.knee.published == r.core.knee.published
    assert list(back.knee.recent) == []
    assert [s.ts_ms for s in back.knee.samples] == [s.ts_ms for s in r.core.knee.samples]


def test_input_marks_round_trip_and_older_state_restores_without_them() -> None:
    r = Replay()
    for e in scenario_events()[:500]:
        r.feed(e)
    r.core.applied = {0: (41, 2), 3: (7, 0)}
    cfg: dict[str, Any] = {
        "interval_ms": 10_000,
        "grace_ms": 2_000,
        "knee": KNEE_CFG,
        "warmup_after": 20,
    }
    assert decode_core(encode_core(r.core), **cfg).applied == {0: (41, 2), 3: (7, 0)}
    # Before the marks (and the segments, two fields more, that came after them).
    older = msgspec.msgpack.encode(msgspec.msgpack.decode(encode_core(r.core))[:-3])
    back = decode_core(older, **cfg)
    assert back.applied == {}
    assert back.load.open == r.core.load.open and back.offset == r.core.offset


def test_knee_candidates_round_trip_with_their_evidence() -> None:
    from tailguard.streams.knee import Knee

    r = Replay()
    for e in scenario_events()[:3_000]:
        r.feed(e)
    r.core.knee.recent.extend(
        [None, Knee(9.5, 1100.0, 400.0, 80, 12, "kneedle", low=9.0, high=10.25)]
    )
    while len(r.core.knee.recent) > KNEE_CFG.confirm_window:
        r.core.knee.recent.popleft()
    back = r.restored()
    assert list(back.core.knee.recent)[-2:] == list(r.core.knee.recent)[-2:]
    assert encode_core(back.core) == encode_core(r.core)
