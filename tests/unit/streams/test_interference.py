"""The interference detector: victim and neighbour, no false alarms, lifecycle, replay."""

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from tailguard.streams.errors import ConfigError
from tailguard.streams.interference import (
    DeploymentState,
    Detector,
    InterferencePolicy,
    InterferenceTransition,
    KvBook,
    SeriesHistory,
    SliPoint,
    evaluate,
    explain,
    interference_breach_id,
    judge_ready,
    offer,
    ready_minutes,
    stalled,
)
from tailguard.streams.kv import MINUTE_MS, KvMinute, TenantUse

T0_MS = 1_699_995_600_000
TENANTS = {"acme": 120, "globex": 60, "initech": 45}  # requests per minute
TTFT = {"acme": 320.0, "globex": 300.0, "initech": 340.0}


def wobble(minute: int, tenant: str) -> float:
    """Deterministic ±8 % noise."""
    return 1.0 + 0.08 * (((minute * 7 + len(tenant) * 13) % 11) / 5.0 - 1.0)


@dataclass
class World:
    """Synthetic minutes of one deployment: loads, P99s and KV fragmentation per minute."""

    minutes: int = 90
    #: minute → tenant → load factor / P99 factor; minute → instance fragmentation.
    load: dict[int, dict[str, float]] = field(default_factory=dict)
    slow: dict[int, dict[str, float]] = field(default_factory=dict)
    frag: dict[int, float] = field(default_factory=dict)
    instances: tuple[str, ...] = ("chat-m-0", "chat-m-1")

    def points(self, minute: int) -> Iterator[tuple[tuple[str, str, str, str], SliPoint]]:
        end = T0_MS + (minute + 1) * MINUTE_MS
        for tenant, base in TENANTS.items():
            count = round(base * self.load.get(minute, {}).get(tenant, 1.0))
            p99 = TTFT[tenant] * wobble(minute, tenant) * self.slow.get(minute, {}).get(tenant, 1.0)
            point = SliPoint(
                end_ms=end,
                count=count,
                ttft_p99=p99,
                ttft_n=count,
                itl_p99=45.0 * wobble(minute + 3, tenant),
                itl_n=count * 100,
                e2e_p99=9_000.0,
                e2e_n=count,
                compliance=0.999,
            )
            yield ("chat", "m", "v1", tenant), point

    def kv_minutes(self, minute: int) -> Iterator[tuple[str, KvMinute]]:
        end = T0_MS + (minute + 1) * MINUTE_MS
        f = self.frag.get(minute, 0.08)
        for instance in self.instances:
            tenants = {}
            for tenant, base in TENANTS.items():
                tokens = int(base * 100 * self.load.get(minute, {}).get(tenant, 1.0))
                tenants[tenant] = TenantUse(sequences=base // 10, tokens=tokens, blocks=0)
            tokens = sum(t.tokens for t in tenants.values())
            block_tokens = round(tokens / (1 - f))
            yield (
                instance,
                KvMinute(
                    end_ms=end,
                    snapshots=12,
                    tokens=tokens,
                    block_tokens=block_tokens,
                    tenants=tenants,
                ),
            )

    def run(self, detector: Detector) -> list[InterferenceTransition]:
        out: list[InterferenceTransition] = []
        for minute in range(self.minutes):
            for instance, km in self.kv_minutes(minute):
                detector.offer_kv(instance, km)
            for series, point in self.points(minute):
                out.extend(detector.offer_point(series, point, [f"trace-{minute}"]))
        return out


def incident(world: World, lo: int, hi: int, *, frag: float = 0.35) -> World:
    for minute in range(lo, hi):
        world.load[minute] = {"acme": 4.0}
        world.slow[minute] = {"globex": 2.1, "initech": 1.9, "acme": 1.8}
        world.frag[minute] = frag
    return world


MakeWorld = Callable[..., World]


@pytest.fixture
def make_world() -> MakeWorld:
    return lambda **kw: World(**kw)


def opened(ts: list[InterferenceTransition]) -> list[InterferenceTransition]:
    return [t for t in ts if t.state == "opened"]


def test_the_victims_and_the_noisy_neighbour_are_named(make_world: MakeWorld) -> None:
    ts = incident(make_world(), 40, 55).run(Detector())
    assert {t.victim for t in opened(ts)} == {"globex", "initech"}
    for t in ts:
        assert t.attribution[0]["tenant"] == "acme"
        assert t.series == ("chat", "m", "v1", t.victim)
    first = opened(ts)[0]
    # persistence: the third consecutive minute of the incident (minute 42) opens it
    assert first.at_ms == T0_MS + 43 * MINUTE_MS
    assert first.breach_id == interference_breach_id("chat", "m", first.victim, first.at_ms)
    assert first.attribution[0]["share"] == 1.0
    assert first.attribution[0]["load_ratio"] == pytest.approx(4.0)
    ev = first.evidence
    assert ev["victim_p99_ratio"]["ttft_ms"] >= 1.5 and ev["victim_load_ratio"] == 1.0
    assert {r["instance"] for r in ev["shared_instances"]} == {"chat-m-0", "chat-m-1"}
    assert ev["fragmentation"] == pytest.approx(0.35, abs=1e-3)
    assert ev["fragmentation_baseline"] == pytest.approx(0.08, abs=1e-3)
    assert first.exemplars, "the victim's slowest requests are attached"


def test_the_breach_resolves_after_the_hold_and_keeps_its_id(make_world: MakeWorld) -> None:
    ts = incident(make_world(), 40, 55).run(Detector())
    for victim in ("globex", "initech"):
        mine = [t for t in ts if t.victim == victim]
        assert next(t.state for t in mine) == "opened" and mine[-1].state == "resolved"
        assert len({t.breach_id for t in mine}) == 1
        assert [t.seq for t in mine] == list(range(len(mine)))
        # last incident minute is 54 (end 55); three quiet minutes 55, 56, 57 → resolved at 58
        assert mine[-1].resolved_ms == T0_MS + 58 * MINUTE_MS


def test_healthy_traffic_opens_nothing(make_world: MakeWorld) -> None:
    assert make_world(minutes=240).run(Detector()) == []


def test_a_fleet_wide_surge_is_not_interference(make_world: MakeWorld) -> None:
    world = make_world()
    for minute in range(40, 55):
        world.load[minute] = {t: 2.0 for t in TENANTS}
        world.slow[minute] = {t: 2.0 for t in TENANTS}
        world.frag[minute] = 0.35
    assert world.run(Detector()) == []


def test_jitter_without_a_louder_neighbour_is_not_interference(make_world: MakeWorld) -> None:
    world = make_world()
    for minute in range(40, 55):
        world.slow[minute] = {"globex": 2.5}
        world.frag[minute] = 0.35
    assert world.run(Detector()) == []


def test_without_fragmentation_evidence_nobody_is_blamed_unless_kv_is_optional(
    make_world: MakeWorld,
) -> None:
    world = incident(make_world(), 40, 55, frag=0.08)
    assert world.run(Detector()) == []
    relaxed = incident(make_world(), 40, 55, frag=0.08).run(
        Detector(InterferencePolicy(require_kv=False))
    )
    assert {t.victim for t in opened(relaxed)} == {"globex", "initech"}


def test_a_short_blip_does_not_open(make_world: MakeWorld) -> None:
    assert incident(make_world(), 40, 42).run(Detector()) == []


def test_a_long_incident_does_not_become_its_own_baseline(make_world: MakeWorld) -> None:
    ts = incident(make_world(minutes=150), 40, 120).run(Detector())
    for victim in ("globex", "initech"):
        mine = [t for t in ts if t.victim == victim]
        assert [t.state for t in mine].count("opened") == 1
        assert mine[-1].state == "resolved" and mine[-1].at_ms >= T0_MS + 120 * MINUTE_MS


def test_replayed_points_change_nothing_and_a_replay_yields_the_same_breaches(
    make_world: MakeWorld,
) -> None:
    world = incident(make_world(), 40, 55)
    det = Detector()
    first = world.run(det)
    assert world.run(det) == [], "every point and KV minute is already held"
    assert incident(make_world(), 40, 55).run(Detector()) == first


def test_state_survives_bytes_mid_episode(make_world: MakeWorld) -> None:
    world = incident(make_world(), 40, 55)
    whole = world.run(Detector())
    det = Detector()
    out: list[InterferenceTransition] = []
    for minute in range(world.minutes):
        if minute == 44:  # inside the episode: restore everything from bytes
            det.states = {
                k: DeploymentState.from_bytes(v.to_bytes()) for k, v in det.states.items()
            }
            det.histories = {
                d: {s: SeriesHistory.from_bytes(h.to_bytes()) for s, h in per.items()}
                for d, per in det.histories.items()
            }
            book = KvBook()
            for instance in det.kv.instances():
                book.load(instance, KvBook.decode(KvBook.encode(det.kv.minutes(instance))))
            det.kv = book
        for instance, km in world.kv_minutes(minute):
            det.offer_kv(instance, km)
        for series, point in world.points(minute):
            out.extend(det.offer_point(series, point, [f"trace-{minute}"]))
    assert out == whole


def test_a_minute_waits_for_every_live_series_but_not_forever() -> None:
    state = DeploymentState(service="chat", model="m")
    policy = InterferencePolicy()
    state.note("v", "acme", T0_MS + 5 * MINUTE_MS)
    state.note("v", "globex", T0_MS + 3 * MINUTE_MS)
    assert ready_minutes(state, policy) == [T0_MS + 3 * MINUTE_MS]
    state.evaluated_ms = T0_MS + 3 * MINUTE_MS
    # globex goes quiet; acme runs on: after stall_minutes globex no longer holds it back
    state.note("v", "acme", T0_MS + 20 * MINUTE_MS)
    ends = ready_minutes(state, policy)
    assert ends[0] == T0_MS + 4 * MINUTE_MS and ends[-1] == T0_MS + 20 * MINUTE_MS


def test_a_stalled_series_is_waited_for_until_the_caller_forces() -> None:
    state = DeploymentState(service="chat", model="m", evaluated_ms=T0_MS + 3 * MINUTE_MS)
    policy = InterferencePolicy()
    state.note("v", "globex", T0_MS + 3 * MINUTE_MS)
    state.note("v", "acme", T0_MS + 20 * MINUTE_MS)
    state.first_ms = T0_MS
    assert stalled(state, policy)
    assert ready_minutes(state, policy, force=False) == []
    assert ready_minutes(state, policy, force=True)[-1] == T0_MS + 20 * MINUTE_MS
    state.note("v", "globex", T0_MS + 19 * MINUTE_MS)  # it was only lagging
    assert not stalled(state, policy)
    assert ready_minutes(state, policy, force=False)[-1] == T0_MS + 19 * MINUTE_MS


def test_the_gate_holds_waits_or_forces() -> None:
    policy = InterferencePolicy()

    def state() -> DeploymentState:
        st = DeploymentState(service="chat", model="m")
        st.note("v", "globex", T0_MS + 3 * MINUTE_MS)
        st.note("v", "acme", T0_MS + 20 * MINUTE_MS)
        return st

    held = state()
    assert judge_ready(held, list, KvBook(), policy, lambda _: "hold").evaluated == []
    assert held.evaluated_ms is None
    waited = judge_ready(state(), list, KvBook(), policy, lambda _: "wait").evaluated
    assert waited[-1] == T0_MS + 3 * MINUTE_MS
    forced = judge_ready(state(), list, KvBook(), policy, lambda _: "force").evaluated
    assert forced[-1] == T0_MS + 20 * MINUTE_MS


def test_a_late_point_is_kept_but_not_judged_again() -> None:
    state = DeploymentState(service="chat", model="m", evaluated_ms=T0_MS + 10 * MINUTE_MS)
    history = SeriesHistory("v", "acme")
    done = offer(
        state,
        history,
        SliPoint(end_ms=T0_MS + 9 * MINUTE_MS, count=5),
        [],
        lambda: [history],
        KvBook(),
        InterferencePolicy(),
    )
    assert done.accepted and done.late and not done.transitions
    assert [p.end_ms for p in history.points] == [T0_MS + 9 * MINUTE_MS]


def test_evaluating_a_judged_minute_again_is_a_no_op() -> None:
    state = DeploymentState(service="chat", model="m", evaluated_ms=T0_MS)
    assert evaluate(state, T0_MS, [], KvBook(), InterferencePolicy()) == []


def test_the_explanation_names_victim_neighbour_and_fragmentation(make_world: MakeWorld) -> None:
    first = opened(incident(make_world(), 40, 55).run(Detector()))[0]
    text = explain(first)
    assert first.victim in text and "acme" in text
    assert "TTFT P99" in text and "fragmentation 0.08 -> 0.35" in text


def test_kv_book_finds_instances_where_both_tenants_ran() -> None:
    book = KvBook()
    both = {"a": TenantUse(1, 10, 1), "b": TenantUse(1, 10, 1)}
    book.add("i0", KvMinute(end_ms=T0_MS, tokens=20, block_tokens=32, tenants=both))
    book.add("i1", KvMinute(end_ms=T0_MS, tokens=10, block_tokens=16, tenants={"a": both["a"]}))
    assert book.instances_with(("a", "b"), T0_MS - MINUTE_MS, T0_MS) == ["i0"]
    assert book.instances_with(("a", "b"), T0_MS, T0_MS + MINUTE_MS) == []
    assert not book.add("i0", KvMinute(end_ms=T0_MS, tenants={})), "a replayed minute"


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"baseline_minutes": 0}, "baseline_minutes"),
        ({"min_baseline_points": 40}, "min_baseline_points"),
        ({"jitter_ratio": 1.0}, "jitter_ratio"),
        ({"trigger_metrics": ("gpu",)}, "trigger_metrics"),
        ({"history_minutes": 20}, "history_minutes"),
        ({"frag_rise_min": 1.5}, "frag_rise_min"),
    ],
)
def test_a_bad_policy_says_what_is_wrong(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        InterferencePolicy(**kw)
