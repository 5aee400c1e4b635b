"""SimConfig / Incident validation and the CLI incident syntax."""

from typing import Any

import pytest

from tailguard.simulator import Incident, ServiceSpec, SimConfig, SimConfigError, Target
from tailguard.simulator.config import ModelSpec


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"rate": 0}, r"rate \(requests/s\) must be > 0"),
        ({"rate": float("nan")}, "rate .* must be finite"),
        ({"duration_s": -1}, "duration_s must be > 0"),
        ({"duration_s": None}, "duration_s is required for poisson"),
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"arrivals": "uniform"}, "arrivals must be one of poisson, bursty, replay"),
        ({"arrivals": "replay"}, "replay arrivals need trace=PATH"),
        ({"arrivals": "replay", "trace": "/nonexistent.csv"}, "does not exist"),
        ({"trace": "x.csv"}, "trace is only used with arrivals='replay'"),
        ({"speedup": 0}, "speedup must be > 0"),
        ({"arrivals": "bursty", "burst_fraction": 1.5}, r"burst_fraction must be in \(0, 1\)"),
        ({"arrivals": "bursty", "burst_factor": 0.5}, "burst_factor must be >= 1"),
        ({"tenants": []}, "tenants must not be empty"),
        ({"tenants": ["a", "a"]}, "tenants must be unique, duplicated: a"),
        ({"tenant_weights": [1.0]}, "tenant_weights must have 3 entries"),
        ({"variants": ["control"]}, "needs at least two variants"),
        ({"services": []}, "services must not be empty"),
        ({"start_ms": -5}, "start_ms must be a non-negative integer"),
        ({"baseline_error_rate": 1.0}, r"baseline_error_rate must be in \[0, 1\)"),
        ({"max_itl_gaps": 0}, "max_itl_gaps must be an integer >= 1"),
        (
            {"incidents": [Incident("silent_collapse", 0, 10, Target(service="chatt"))]},
            "target service 'chatt' does not exist",
        ),
        (
            {
                "incidents": [
                    Incident(
                        "error_burst", 0, 10, Target(service="chat", model="qwen2-7b-instruct")
                    )
                ]
            },
            "service 'chat' has no model 'qwen2-7b-instruct'",
        ),
        (
            {"experiment": None, "variants": [], "incidents": [Incident("slow_treatment", 0, 5)]},
            "slow_treatment needs variants",
        ),
    ],
)
def test_invalid_config_is_refused_with_a_clear_message(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(**overrides)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "meltdown", "start_s": 0, "end_s": 1}, "incident kind must be one of"),
        ({"kind": "error_burst", "start_s": 5, "end_s": 5}, "must be greater than start_s"),
        ({"kind": "error_burst", "start_s": -1, "end_s": 5}, "start_s must be >= 0"),
        ({"kind": "error_burst", "start_s": 0, "end_s": 5, "intensity": 2.0}, "non-ok rate"),
        (
            {"kind": "silent_collapse", "start_s": 0, "end_s": 5, "intensity": 0},
            "share of requests",
        ),
        ({"kind": "noisy_neighbor", "start_s": 0, "end_s": 5}, "must name the noisy tenant"),
        (
            {
                "kind": "noisy_neighbor",
                "start_s": 0,
                "end_s": 5,
                "target": Target(tenant="a"),
                "intensity": 1,
            },
            "load multiplier",
        ),
    ],
)
def test_invalid_incident_is_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(SimConfigError, match=message):
        Incident(**kwargs)


def test_config_errors_are_value_errors_of_the_tailguard_tree() -> None:
    from tailguard.errors import TailguardError

    with pytest.raises(TailguardError):
        SimConfig(rate=-1)
    assert issubclass(SimConfigError, ValueError)


def test_incident_intensity_defaults_per_kind() -> None:
    assert Incident("silent_collapse", 0, 1).intensity == 1.0
    assert Incident("error_burst", 0, 1).intensity == 0.15
    assert Incident("noisy_neighbor", 0, 1, Target(tenant="acme")).intensity == 4.0
    assert Incident("slow_treatment", 0, 1).intensity == 1.6


def test_slow_treatment_targets_the_last_variant_by_default() -> None:
    cfg = SimConfig(incidents=[Incident("slow_treatment", 0, 10)])
    assert cfg.incidents[0].target.variant == "treatment"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("error_burst:30:45", Incident("error_burst", 30, 45)),
        ("silent_collapse:60:180:all", Incident("silent_collapse", 60, 180)),
        (
            "silent_collapse:60:180:service=chat,model=llama-3.1-8b-instruct",
            Incident(
                "silent_collapse", 60, 180, Target(service="chat", model="llama-3.1-8b-instruct")
            ),
        ),
        (
            "noisy_neighbor:0:120:tenant=acme,intensity=6",
            Incident("noisy_neighbor", 0, 120, Target(tenant="acme"), intensity=6.0),
        ),
        (
            "error_burst:1:2:model=llama3:8b",
            Incident("error_burst", 1, 2, Target(model="llama3:8b")),
        ),
    ],
)
def test_incident_parses_its_cli_form(text: str, expected: Incident) -> None:
    assert Incident.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("silent_collapse:60", "must look like KIND:START_S:END_S"),
        ("silent_collapse:a:b", "must be numbers of seconds"),
        ("silent_collapse:1:2:service", "must be key=value"),
        ("silent_collapse:1:2:region=eu", "unknown filter key 'region'"),
        ("silent_collapse:1:2:intensity=high", "intensity must be a number"),
    ],
)
def test_bad_incident_text_is_refused(text: str, message: str) -> None:
    with pytest.raises(SimConfigError, match=message):
        Incident.parse(text)


def test_services_accept_model_names_and_lay_out_instances_on_8_gpu_hosts() -> None:
    cfg = SimConfig(
        services=[
            ServiceSpec("a", models=["m1"]),  # type: ignore[arg-type]
            ServiceSpec("b", models=(ModelSpec("big", instances=3, gpus_per_instance=4),)),
        ]
    )
    layout = cfg.instance_layout()
    assert [name for name, _, _ in layout] == ["a-m1-0", "a-m1-1", "b-big-0", "b-big-1", "b-big-2"]
    assert [(host, gpus) for _, host, gpus in layout] == [
        ("gpu-node-01", [0]),
        ("gpu-node-01", [1]),
        ("gpu-node-01", [2, 3, 4, 5]),
        ("gpu-node-02", [0, 1, 2, 3]),
        ("gpu-node-02", [4, 5, 6, 7]),
    ]


def test_start_ms_defaults_to_now_once() -> None:
    import time

    before = time.time_ns() // 1_000_000
    cfg = SimConfig()
    assert cfg.start_ms is not None and before <= cfg.start_ms <= before + 5_000
    assert cfg.to_dict()["start_ms"] == cfg.start_ms
