"""Experiment definitions from YAML."""

from pathlib import Path

import pytest
from tailguard.schemas.experiments import (
    ExperimentConfigError,
    load_experiments,
    parse_experiments,
)

REPO = Path(__file__).resolve().parents[3]


def test_the_shipped_example_loads() -> None:
    defs = load_experiments(REPO / "infra" / "experiments" / "canary.yaml")
    canary = defs["canary-prompt-v2"]
    assert canary.control == "control" and canary.weights == {"control": 0.5, "treatment": 0.5}
    assert {g.name for g in canary.guardrails} >= {
        "ttft_p95.max_ratio",
        "success_rate.min",
        "interruption_rate.max_diff",
        "session_completion.min_diff",
    }


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("experiments:\n  - id: a\n    arms: [x, y]\n  - id: b\n    arms: [x]\n", "f.yaml:4:"),
        ("experiments:\n  - id: a\n    arms: [x, y]\n  - id: a\n    arms: [x, y]\n", "f.yaml:4:"),
        ("experiments: [\n", "f.yaml:"),
        ("nothing: here\n", "f.yaml:1:"),
    ],
)
def test_errors_name_the_file_and_line(text: str, where: str) -> None:
    with pytest.raises(ExperimentConfigError, match=f"^{where}"):
        parse_experiments(text, "f.yaml")
