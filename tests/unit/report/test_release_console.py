"""The demo's few-line view of a ``tailguard.release.v1`` decision (``release_lines``)."""

import json
from typing import Any

import pytest

from tailguard import console
from tailguard.console import release_lines

#: A rollback by the human-feedback guardrail, trimmed from a real worker's record.
ROLLBACK: dict[str, Any] = {
    "ts_ms": 1_699_995_600_000,
    "experiment": "support-prompt-v3",
    "decision": "rollback",
    "arm": "treatment",
    "weights": {"control": 1.0, "treatment": 0.0},
    "reasons": ["guardrail breached: hallucination_rate in treatment: …"],
    "evidence": {
        "metrics": {
            "hallucination_rate.max_diff": {
                "constraint": {"max_diff": 0.02},
                "effect": "diff",
                "arms": {
                    "treatment": {"value": 0.0730223, "n": 1479},
                    "control": {"value": 0.0407627, "n": 1521},
                },
                "difference": 0.0322597,
                "interval": [0.00738419, 0.0571351],
                "status": "breached",
                "test": {
                    "test": "stratified permutation",
                    "p_value": 8.522e-05,
                    "look": 3,
                    "looks": 6,
                    "look_at_ratings": 800,
                    "alpha_per_look": 0.0016667,
                    "raters": 6,
                    "raters_per_arm": {"treatment": 6, "control": 6},
                    "strata": {
                        "pg-support-v3": {
                            "treatment": {"rated": 1479, "hallucination": 108},
                            "control": {"rated": 0, "hallucination": 0},
                        },
                        "pg-support-v1": {
                            "treatment": {"rated": 0, "hallucination": 0},
                            "control": {"rated": 1521, "hallucination": 62},
                        },
                    },
                    "pooled_single_arm_strata": True,
                },
            }
        },
        "arms": {
            "control": {"prompt_versions": {"support-v1": 1671}},
            "treatment": {"prompt_versions": {"support-v3": 1614}},
        },
        "prompt_groups": {
            "control": [
                {
                    "prompt_group": "pg-support-v1",
                    "versions": ["support-v1"],
                    "requests": 1671,
                    "bad": 39,
                    "exemplars": ["b0b260aeb8c8f433dfe3c1fb254383a0"],
                }
            ],
            "treatment": [
                {
                    "prompt_group": "pg-support-v3",
                    "versions": ["support-v3"],
                    "requests": 1614,
                    "bad": 29,
                    "exemplars": ["c4e7e045503d8f29552c873e676d490f", "9b4dd6eda80070a1"],
                }
            ],
        },
    },
}


def test_a_hallucination_rollback_shows_rates_difference_test_raters_and_strata() -> None:
    lines = release_lines(ROLLBACK)
    assert lines[0] == (
        "21:00:00Z  rollback support-prompt-v3 (arm treatment; weights control 100%, treatment 0%)"
    )
    text = "\n".join(lines)
    assert "treatment 7.30 % (n 1,479) vs control 4.08 % (n 1,521)" in text
    assert "difference +3.23 points [+0.74, +5.71] (limit max_diff 0.02)" in text
    assert "p = 8.5e-05 < 0.0017 at look 3 of 6 (800 ratings per arm); 6 raters" in text
    assert "pg-support-v3 (treatment 108/1,479), pg-support-v1 (control 62/1,521)" in text
    assert "single-arm strata pooled" in text
    assert "…" not in text  # the breached guardrail says it; the reason is not repeated


def test_prompt_evidence_lists_each_arm_with_groups_versions_and_exemplar_traces() -> None:
    lines = release_lines(ROLLBACK)
    treatment, control = lines[-2:]
    assert treatment.startswith("  treatment: prompts served support-v3 1,614")
    assert "pg-support-v3 [support-v3] 29 bad of 1,614" in treatment
    assert "c4e7e045503d8f29552c873e676d490f, 9b4dd6eda80070a1" in treatment
    assert control.startswith("  control: prompts served support-v1 1,671")
    assert "b0b260aeb8c8f433dfe3c1fb254383a0" in control


def test_a_decision_without_a_breach_is_its_reasons_and_sparse_records_do_not_fail() -> None:
    lines = release_lines(
        {
            "ts_ms": 0,
            "experiment": "e",
            "decision": "continue",
            "reasons": ["collecting evidence: hallucination_rate not yet decided"],
        }
    )
    assert lines == [
        "00:00:00Z  continue e",
        "  collecting evidence: hallucination_rate not yet decided",
    ]


def test_watch_release_prints_the_experiments_decisions_and_stops_at_the_rollback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    other = {**ROLLBACK, "experiment": "canary-prompt-v2"}
    early = {"ts_ms": 0, "experiment": "support-prompt-v3", "decision": "continue"}
    records = [other, early, ROLLBACK, {**ROLLBACK, "ts_ms": 1}]
    monkeypatch.setattr(
        console,
        "follow",
        lambda *_a, **_k: iter((None, json.dumps(r).encode(), []) for r in records),
    )
    got = console.watch_release("broker", experiment="support-prompt-v3", timeout_s=1)
    assert got == ROLLBACK
    out = capsys.readouterr().out
    assert "canary-prompt-v2" not in out and out.count("rollback support-prompt-v3") == 1
    assert "00:00:00Z  continue support-prompt-v3" in out
    assert "pg-support-v3 [support-v3] 29 bad" in out  # brackets are text, not rich markup
