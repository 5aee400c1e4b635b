"""Layered hashing (Tang et al. 2010): deterministic, weighted, exclusive within a layer,
orthogonal across layers; release overrides move served arms, never assignments."""

import math
from collections import Counter

import pytest

from tailguard.gateway.errors import RoutingConfigError
from tailguard.gateway.routing import (
    PRIMARY,
    ArmRoute,
    ExperimentRoute,
    Layer,
    Override,
    Router,
    unit_point,
)

N = 20_000


def _exp(
    eid: str, weights: tuple[float, ...] = (0.5, 0.5), traffic: float = 1.0
) -> ExperimentRoute:
    names = ["control", *[f"t{i}" for i in range(1, len(weights))]]
    arms = tuple(
        ArmRoute(n, w, upstream=PRIMARY if n == "control" else "canary", prompt_version=f"v-{n}")
        for n, w in zip(names, weights, strict=True)
    )
    return ExperimentRoute(eid, arms, "control", traffic)


def _override(decision: str, arm: str | None, seq: int = 1, gen: int = 1) -> Override:
    return Override("e1", decision, arm, gen, seq, f"ev-{seq}")


def test_unit_point_is_pinned_across_processes_and_machines() -> None:
    # Pinned values: a change to the hash would move every unit of every running experiment.
    assert unit_point("release", "user-1") == 0.7124276016711936
    assert unit_point("layer-a", "user-42") == 0.7749897501828006
    assert unit_point("layer-b", "user-42") != unit_point("layer-a", "user-42")


def test_arms_get_their_weights() -> None:
    router = Router((Layer("l", (_exp("e1", (0.9, 0.1)),)),))
    counts = Counter(router.select(f"u{i}").primary.assigned for i in range(N))  # type: ignore[union-attr]
    share = counts["t1"] / N
    assert abs(share - 0.1) < 4 * math.sqrt(0.1 * 0.9 / N)


def test_experiments_of_one_layer_exclude_each_other() -> None:
    layer = Layer("l", (_exp("a", traffic=0.3), _exp("b", traffic=0.3)))
    router = Router((layer,))
    seen = Counter()
    for i in range(N):
        sel = router.select(f"u{i}")
        assert len(sel.routes) <= 1
        seen[sel.primary.experiment if sel.primary else None] += 1
    for key, want in (("a", 0.3), ("b", 0.3), (None, 0.4)):
        assert abs(seen[key] / N - want) < 0.02


def test_layers_are_orthogonal() -> None:
    router = Router((Layer("x", (_exp("a"),)), Layer("y", (_exp("b"),))))
    joint = Counter()
    for i in range(N):
        sel = router.select(f"u{i}")
        assert [r.experiment for r in sel.routes] == ["a", "b"]
        joint[(sel.routes[0].assigned, sel.routes[1].assigned)] += 1
    for cell in joint.values():  # independent: each of the 4 cells holds ~1/4
        assert abs(cell / N - 0.25) < 0.02


def test_no_unit_means_no_experiment_and_the_primary_upstream() -> None:
    router = Router((Layer("l", (_exp("e1"),)),))
    sel = router.select(None)
    assert sel.routes == () and sel.upstream == PRIMARY and sel.primary is None


def test_rollback_sends_the_treatment_to_control_and_keeps_assignment() -> None:
    base = Router((Layer("l", (_exp("e1"),)),))
    rolled = base.with_overrides({"e1": _override("rollback", "t1")})
    for i in range(2_000):
        before, after = base.select(f"u{i}").primary, rolled.select(f"u{i}").primary
        assert before is not None and after is not None
        assert after.assigned == before.assigned
        assert after.served == "control"
        assert rolled.select(f"u{i}").upstream == PRIMARY


def test_rollback_without_an_arm_rolls_back_every_treatment() -> None:
    router = Router((Layer("l", (_exp("e1", (1, 1, 1)),)),)).with_overrides(
        {"e1": _override("rollback", None)}
    )
    assert {router.select(f"u{i}").primary.served for i in range(500)} == {"control"}  # type: ignore[union-attr]


def test_rollback_of_one_arm_leaves_the_other_treatment() -> None:
    router = Router((Layer("l", (_exp("e1", (1, 1, 1)),)),)).with_overrides(
        {"e1": _override("rollback", "t1")}
    )
    served = Counter(router.select(f"u{i}").primary.served for i in range(3_000))  # type: ignore[union-attr]
    assert "t1" not in served and served["t2"] > 800


def test_promote_sends_everyone_to_the_promoted_arm() -> None:
    router = Router((Layer("l", (_exp("e1"),)),)).with_overrides({"e1": _override("promote", "t1")})
    sel = {router.select(f"u{i}").primary.served for i in range(500)}  # type: ignore[union-attr]
    assert sel == {"t1"}
    assert router.select("u1").upstream == "canary"


def test_session_experiments_use_the_session_id() -> None:
    exp = ExperimentRoute(
        "s", (ArmRoute("control", 1), ArmRoute("t", 1)), "control", unit="session_id"
    )
    router = Router((Layer("l", (exp,)),))
    assert router.select("unit-only").routes == ()
    sel = router.select("u", "sess-1")
    assert sel.primary is not None and sel.primary.unit == "sess-1"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Layer("l", (_exp("a", traffic=0.7), _exp("b", traffic=0.7))), "adds up"),
        (lambda: ExperimentRoute("e", (ArmRoute("a", 1),), "a"), "two arms"),
        (lambda: ExperimentRoute("e", (ArmRoute("a", 1), ArmRoute("b", 1)), "c"), "control"),
        (lambda: ArmRoute("a", 0), "weight"),
        (lambda: Router((Layer("x", (_exp("a"),), "s"), Layer("y", (_exp("b"),), "s"))), "salts"),
        (lambda: Router((Layer("x", (_exp("a"),)), Layer("y", (_exp("a"),)))), "in layers"),
    ],
)
def test_bad_routing_is_refused_with_a_reason(build, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RoutingConfigError, match=message):
        build()
