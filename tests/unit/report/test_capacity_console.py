"""The demo's and the report's one-line view of ``tailguard.capacity`` records."""

from typing import Any

from tailguard.console import capacity_line


def record(kind: str, decision: str, **kw: Any) -> dict[str, Any]:
    base = {
        "ts_ms": 1_699_995_600_000,
        "kind": kind,
        "decision": decision,
        "reason": "threshold",
        "deployment": {"service": "chat", "model": "ramp"},
    }
    return {**base, **kw}


def test_a_scale_up_says_the_load_the_threshold_and_the_capacity_it_needs() -> None:
    ev = {"concurrency": 11.05, "up_threshold": 9.57, "knee": 7.98, "capacity_factor": 1.385}
    line = capacity_line(record("scale", "scale_up", evidence={**ev, "util_pct": 20.0}))
    assert line.startswith("21:00:00Z  chat/ramp")
    assert "concurrency 11.05 ≥ 9.57 (knee 7.98)" in line and "capacity ×1.39" in line


def test_breaker_and_threshold_moves_name_their_subject_and_the_change() -> None:
    half = capacity_line(
        record(
            "breaker",
            "half_open",
            expert=5,
            evidence={"before": "open", "cooldown_ms": 30_000, "fallback_share": 0.119},
        )
    )
    assert "expert 5" in half and "open → half_open: cool-down of 30 s over, probing" in half
    rag = capacity_line(
        record(
            "rag_threshold",
            "lowered",
            index="kb",
            evidence={"previous": 0.707, "threshold": 0.549, "quantile": 0.05, "band": 0.087},
        )
    )
    assert "index kb" in rag and "threshold 0.707 → 0.549" in rag and "band ±0.087" in rag


def test_a_held_scale_up_reads_as_an_overload_not_as_a_low_load() -> None:
    ev = {"concurrency": 46.1, "up_threshold": 41.9, "down_threshold": 20.9, "knee": 34.9}
    line = capacity_line(record("scale", "hold", reason="cooldown", evidence=ev))
    assert "concurrency 46.1 ≥ 41.9" in line and "[cooldown]" in line
