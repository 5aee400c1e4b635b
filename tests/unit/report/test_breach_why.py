"""The console's one-cell explanation of a breach (causes, stages, prompts)."""

from tailguard.console import _why


def breach(state: str = "opened") -> dict:
    return {
        "state": state,
        "attribution": [{"cause": "prefix_cache_miss", "share": 0.92}],
        "stages": [{"stage": "prefill", "increase_ms": 840.0}],
        "prompts": [
            {"prompt_version": "sum-v7", "prompt_group": "pg-sum-v6", "bad_share": 0.7},
            {"prompt_version": "sum-v6", "prompt_group": None, "bad_share": 0.3},
        ],
    }


def test_an_open_breach_names_causes_stages_and_prompts_with_their_groups() -> None:
    lines = _why(breach()).splitlines()
    assert lines == [
        "prefix_cache_miss 92%",
        "prefill +840 ms",
        "prompts: sum-v7 70% (pg-sum-v6), sum-v6 30%",
    ]


def test_a_resolved_breach_keeps_only_the_causes_and_malformed_rows_are_skipped() -> None:
    b = breach("resolved")
    assert _why(b) == "prefix_cache_miss 92%"
    b = breach()
    b["prompts"] = [{"prompt_version": "x"}, "junk"]
    assert "prompts" not in _why(b)
