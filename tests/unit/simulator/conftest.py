"""Factory fixtures for the ``tailguard.simulator`` unit tests.

``make_cfg`` builds a :class:`SimConfig` with a fixed ``start_ms`` (so runs are
reproducible) and lets each test spell out only what it is about;
``events_of`` materialises a run; ``azure_head_csv`` writes the first rows of
the Azure LLM inference trace 2023 (conversation; CC-BY 4.0, Patel et al.,
"Splitwise", ISCA 2024) to a temporary file.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tailguard.simulator import SimConfig, generate

#: 2023-11-14 21:00:00 UTC.
T0_MS = 1_699_995_600_000

#: The first ten rows of AzureLLMInferenceTrace_conv.csv (CC-BY 4.0;
#: Patel, Choukse, Zhang, Shah, Goiri, Maleki, Bianchini, "Splitwise", ISCA 2024).
AZURE_HEAD = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
2023-11-16 18:15:51.3910170,91,16
2023-11-16 18:15:52.5732450,91,16
2023-11-16 18:15:52.9921190,381,84
2023-11-16 18:15:54.4260870,1313,142
2023-11-16 18:15:54.9320210,388,84
2023-11-16 18:15:55.0176690,242,14
2023-11-16 18:15:55.1455750,209,152
"""

#: The real trace, where the shared data folder exists (tests that need it skip otherwise).
AZURE_TRACE = Path("/work/shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv")

MakeCfg = Callable[..., SimConfig]


@pytest.fixture
def make_cfg() -> MakeCfg:
    """``make_cfg(**overrides)``: 20 req/s for 60 s, seed 1, start at ``T0_MS``."""

    def make(**overrides: Any) -> SimConfig:
        base: dict[str, Any] = {"rate": 20.0, "duration_s": 60.0, "seed": 1, "start_ms": T0_MS}
        base.update(overrides)
        return SimConfig(**base)

    return make


@pytest.fixture
def events_of() -> Callable[[SimConfig], list[dict[str, Any]]]:
    """Materialise a run's events."""
    return lambda cfg: list(generate(cfg))


@pytest.fixture
def azure_head_csv(tmp_path: Path) -> Path:
    """A CSV with the first ten rows of the Azure conversation trace."""
    path = tmp_path / "azure_head.csv"
    path.write_bytes(AZURE_HEAD.replace("\n", "\r\n").encode())  # CRLF, as the original
    return path
