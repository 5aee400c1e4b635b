"""The routing file is an experiments file with a routing: section."""

import pytest
from tailguard.schemas.experiments import parse_experiments

from tailguard.gateway.config import GatewayConfig, canary_routing, parse_routing
from tailguard.gateway.errors import RoutingConfigError

TEXT = """
apiVersion: tailguard/v1
kind: Experiments
experiments:
  - id: canary-v2
    arms: [{name: control, weight: 0.9}, {name: canary, weight: 0.1}]
  - id: prompt-style
    unit: session_id
    arms: [a, b]
  - id: guarded-only
    arms: [x, y]
routing:
  unit_header: X-My-Unit
  layers:
    prompts: {salt: prompts-2025}
  experiments:
    canary-v2:
      layer: release
      arms:
        control: {upstream: primary, prompt_version: v1}
        canary: {upstream: canary, prompt_version: v2}
    prompt-style:
      layer: prompts
      traffic: 0.5
      arms:
        a: {prompt_version: terse}
        b: {prompt_version: chatty}
"""


def test_the_file_gives_layers_arms_weights_and_upstreams() -> None:
    routing = parse_routing(TEXT)
    router = routing.router
    assert routing.unit_header == "x-my-unit"
    assert [layer.name for layer in router.layers] == ["release", "prompts"]
    assert router.layers[1].salt == "prompts-2025"
    canary = router.experiments["canary-v2"]
    assert canary.weights == pytest.approx({"control": 0.9, "canary": 0.1})
    assert canary.arm("canary").upstream == "canary"
    assert router.experiments["prompt-style"].unit == "session_id"
    assert "guarded-only" not in router.experiments
    assert router.upstreams() == {"primary", "canary"}


def test_the_guard_reads_the_same_file() -> None:
    assert set(parse_experiments(TEXT)) == {"canary-v2", "prompt-style", "guarded-only"}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("layer: release", "layer: release\n      weight: 3"), "unknown key"),
        (("canary: {upstream: canary, prompt_version: v2}", "nope: {}"), "not arms"),
        (("prompt-style:\n      layer", "missing:\n      layer"), "no experiment 'missing'"),
        (("traffic: 0.5", "traffic: 1.5"), "traffic"),
    ],
)
def test_mistakes_are_refused_with_where_and_why(edit: tuple[str, str], message: str) -> None:
    with pytest.raises(RoutingConfigError, match=message):
        parse_routing(TEXT.replace(*edit))


def test_an_arm_naming_an_unconfigured_upstream_is_refused() -> None:
    with pytest.raises(RoutingConfigError, match="upstream-canary"):
        GatewayConfig(upstreams={"primary": "http://a"}, routing=parse_routing(TEXT))


def test_canary_shortcut_splits_units_between_primary_and_canary() -> None:
    routing = canary_routing("c", 0.2)
    exp = routing.router.experiments["c"]
    assert exp.weights == pytest.approx({"control": 0.8, "canary": 0.2})
    assert routing.router.upstreams() == {"primary", "canary"}
