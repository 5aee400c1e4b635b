"""The simulator's canary scenario: a new prompt version that defeats the prefix cache."""

import numpy as np
import pytest

from tailguard.simulator.config import Incident, SimConfig
from tailguard.simulator.errors import SimConfigError
from tailguard.simulator.model import generate


def events(incidents: tuple[Incident, ...]) -> list[dict[str, object]]:
    cfg = SimConfig(
        rate=20, duration_s=120, seed=3, start_ms=1_700_000_000_000, incidents=incidents
    )
    return list(generate(cfg))


def hit_rate(evs: list[dict[str, object]]) -> float:
    hit = sum(e["cache"]["prefix_hit_tokens"] for e in evs)  # type: ignore[index]
    query = sum(e["cache"]["prefix_query_tokens"] for e in evs)  # type: ignore[index]
    return hit / query


def test_the_treatment_ships_v2_and_misses_the_cache() -> None:
    inc = Incident.parse("prompt_cache_miss:0:120")
    evs = events((inc,))
    treated = [e for e in evs if e["variant"] == "treatment"]
    control = [e for e in evs if e["variant"] == "control"]
    assert {e["prompt_version"] for e in treated} == {"v2"}
    assert {e["prompt_version"] for e in control} == {"v1"}
    assert hit_rate(treated) < 0.15 < 0.95 < hit_rate(control)
    ttft_t = np.percentile([e["ttft_ms"] for e in treated if "ttft_ms" in e], 95)
    ttft_c = np.percentile([e["ttft_ms"] for e in control if "ttft_ms" in e], 95)
    assert ttft_t > 1.3 * ttft_c


def test_without_the_incident_events_are_unchanged() -> None:
    plain = events(())
    assert all("prompt_version" not in e for e in plain)


def test_intensity_is_a_share() -> None:
    with pytest.raises(SimConfigError, match="share of requests hit"):
        Incident.parse("prompt_cache_miss:0:10:intensity=2")
