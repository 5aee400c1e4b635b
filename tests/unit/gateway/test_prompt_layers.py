"""Concurrent prompt experiments in different layers are independent (issue 10 part 3),
and the event of a request in several experiments names all of them."""

from collections import Counter

import msgspec
import numpy as np
import pytest
from scipy.stats import chi2_contingency
from tailguard.agents.experiments import decode_internal, route_requests
from tailguard.schemas import InferenceEvent
from tailguard.streams.experiment import ExperimentRequests

from tailguard.gateway.errors import RoutingConfigError
from tailguard.gateway.meter import Measurement
from tailguard.gateway.routing import PRIMARY, ArmRoute, ExperimentRoute, Layer, Router
from tailguard.gateway.server import build_event

N = 20_000
ALPHA = 0.001


def prompt_exp(
    eid: str, traffic: float, versions: tuple[str, str] | None = None
) -> ExperimentRoute:
    v = versions or (None, None)
    return ExperimentRoute(
        eid,
        (
            ArmRoute("control", 0.5, prompt_version=v[0]),
            ArmRoute("treatment", 0.5, prompt_version=v[1]),
        ),
        "control",
        traffic,
    )


def two_layers(salt_a: str, salt_b: str) -> tuple[Layer, Layer]:
    prompt = Layer(
        "prompt",
        (prompt_exp("p1", 0.5, ("p1-v1", "p1-v2")), prompt_exp("p2", 0.5, ("p2-v1", "p2-v2"))),
        salt_a,
    )
    other = Layer("decoding", (prompt_exp("d1", 0.5), prompt_exp("d2", 0.5)), salt_b)
    return prompt, other


def cross_table(a: Layer, b: Layer) -> np.ndarray:
    """(experiment, arm) of layer a × (experiment, arm) of layer b over N units."""
    cells: Counter[tuple[str, str]] = Counter()
    for i in range(N):
        ha, hb = a.assign(f"user-{i}"), b.assign(f"user-{i}")
        assert ha is not None and hb is not None  # traffic adds up to 1 in both layers
        cells[(f"{ha[0].id}:{ha[1].name}", f"{hb[0].id}:{hb[1].name}")] += 1
    rows = sorted({r for r, _ in cells})
    cols = sorted({c for _, c in cells})
    return np.array([[cells[(r, c)] for c in cols] for r in rows])


def test_arms_of_different_layers_are_independent_by_chi_square() -> None:
    table = cross_table(*two_layers("prompt", "decoding"))
    assert table.shape == (4, 4) and table.sum() == N
    res = chi2_contingency(table)
    assert res.pvalue > ALPHA, table
    # every arm of one layer is split evenly over the other layer's four cells
    shares = table / table.sum(axis=1, keepdims=True)
    assert np.all(np.abs(shares - 0.25) < 0.03)


def test_a_shared_salt_fails_the_same_test() -> None:
    table = cross_table(*two_layers("same", "same"))
    res = chi2_contingency(table)
    assert res.pvalue < 1e-12  # the test can fail: shared salt = the same slice in both layers
    assert np.count_nonzero(table) == 4  # each arm of one layer meets one arm of the other
    with pytest.raises(RoutingConfigError, match="distinct salts"):
        Router(two_layers("same", "same"))


def test_the_event_lists_every_layers_experiment_and_the_served_prompt() -> None:
    prompt, _ = two_layers("prompt", "decoding")
    release = Layer(
        "release",
        (
            ExperimentRoute(
                "canary",
                (ArmRoute("control", 0.5, PRIMARY), ArmRoute("canary", 0.5, PRIMARY)),
                "control",
            ),
        ),
    )
    router = Router((release, prompt))
    sel = router.select("user-7")
    assert len(sel.routes) == 2
    m = Measurement(
        e2e_s=0.5, ttft_s=0.1, gaps_s=[0.01], token_chunks=2, output_tokens=2, input_tokens=3,
        model="m", done=True, stream_error=None,
    )  # fmt: skip
    ev = build_event(
        ts_ms=1_700_000_000_000, service="s", model="m", status="ok", m=m, selection=sel,
        tenant=None, unit="user-7", session=None, trace_id=None, instance="primary",
        error_type=None,
    )  # fmt: skip
    prompt_route = sel.routes[1]
    # experiment/variant: the route that chose the upstream; prompt_version: the prompt layer's
    assert ev["experiment"] == "canary"
    assert ev["prompt_version"] == prompt_route.prompt_version
    assert ev["experiments"] == [
        {"experiment": "canary", "variant": sel.routes[0].served, "layer": "release"},
        {
            "experiment": prompt_route.experiment,
            "variant": prompt_route.served,
            "layer": "prompt",
            "prompt_version": prompt_route.prompt_version,
        },
    ]
    # the A/B guard gets the request once in each experiment, as that experiment's arm
    decoded = msgspec.json.decode(msgspec.json.encode(ev), type=InferenceEvent)
    routed = route_requests([decoded], [(0, 1)], partitions=4)
    got = {}
    for _, key, value in routed:
        msg = decode_internal(value)
        cols = ExperimentRequests.from_wire(msg.cols)  # type: ignore[union-attr]
        got[key.decode()] = (
            cols.arm_names[int(cols.arm[0])],
            cols.prompt_names[int(cols.prompt[0])],
        )
    assert got == {
        "canary": (sel.routes[0].served, prompt_route.prompt_version),
        prompt_route.experiment: (prompt_route.served, prompt_route.prompt_version),
    }
