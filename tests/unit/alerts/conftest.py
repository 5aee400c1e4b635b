"""Factories of ``tailguard.breach.v1`` and ``tailguard.release.v1`` records for the subscribers.

The breach has every field :func:`tailguard.agents.breaches.breach_payload`
writes (a test checks the mapping against that function's own output too);
tests override what they are about.
"""

import json
from collections.abc import Callable
from typing import Any

import pytest

#: 2024-06-01 12:00 UTC.
T0_MS = 1_717_243_200_000
MIN = 60_000

MakeRecord = Callable[..., dict[str, Any]]


def breach_record(**over: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "schema": "tailguard.breach.v1",
        "event_id": "b1:0",
        "ts_ms": T0_MS + 9 * MIN + 2_000,
        "breach_id": "b1",
        "state": "opened",
        "seq": 0,
        "kind": "burn_rate",
        "severity": "page",
        "slo": "ttft-p99",
        "series": {
            "service": "chat",
            "model": "llama-3.1-8b",
            "variant": "default",
            "tenant": "acme",
        },
        "at_ms": T0_MS + 9 * MIN,
        "burn_rates": {"1h": 14.9, "5m": 100.0},
        "peak_burn_rates": {"1h": 14.9, "5m": 100.0},
        "rules": ["page-1h-5m"],
        "reason": None,
        "sli": {"1h": 0.85, "5m": 0.0},
        "budget_remaining": 0.42,
        "exemplars": ["4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7a3ce929d0e0e4736"],
        "attribution": [
            {"cause": "queue_wait", "share": 0.62, "rate": 0.5},
            {"cause": "prefix_cache_miss", "share": 0.3, "rate": 0.2},
        ],
        "stages": [{"stage": "prefill", "p99_ms": 1500.0, "increase_ms": 1290.0, "ratio": 7.14}],
        "gpu": [],
        "gpu_note": "no GPU known for this series (no host/gpu_ids in its events)",
        "opened_ms": T0_MS + 9 * MIN,
        "resolved_ms": None,
    }
    record.update(over)
    return record


def release_record(**over: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "schema": "tailguard.release.v1",
        "event_id": "exp-42:rollback:0",
        "ts_ms": T0_MS + 30 * MIN,
        "experiment": "exp-42",
        "decision": "rollback",
        "arm": "canary",
        "reasons": ["ttft p95 guardrail: canary +41% (anytime-valid p < 0.01)"],
        "evidence": {"ttft_p95_ms": {"control": 310.0, "canary": 437.0, "p_value": 0.004}},
        "weights": {"control": 1.0, "canary": 0.0},
    }
    record.update(over)
    return record


def encoded(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode()


@pytest.fixture
def make_breach() -> MakeRecord:
    return breach_record


@pytest.fixture
def make_release() -> MakeRecord:
    return release_record
