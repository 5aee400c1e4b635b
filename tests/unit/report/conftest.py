"""Factories of synthetic ``tailguard.sli.v1`` snapshots and ``tailguard.breach.v1`` records.

Snapshots are built as :class:`SliSnapshot` Structs and turned into the dicts
a consumer decodes from the topic, so every one of them is valid per the
contract; the tests spell out only the stage P99s they are about.
"""

from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from tailguard.schemas import PercentileSummary, Series, SliSnapshot

#: An hour-aligned event time (2024-06-01 12:00 UTC) that the tests count from.
T0_MS = 1_717_243_200_000
MINUTE_MS = 60_000
SERIES = {"service": "chat", "model": "llama-3.1-8b", "variant": "default", "tenant": "default"}
KEY = "chat/llama-3.1-8b/default/default"

MakeSnapshot = Callable[..., dict[str, Any]]
MakeBreach = Callable[..., dict[str, Any]]


def _summary(p99: float | None) -> PercentileSummary:
    if p99 is None:
        return PercentileSummary(count=0)
    return PercentileSummary(
        p50=p99 / 3, p90=p99 / 1.6, p95=p99 / 1.3, p99=p99, p999=p99 * 1.4, count=240
    )


def snapshot(
    end_ms: int,
    stages: dict[str, float | None],
    *,
    series: dict[str, str] | None = None,
    window: str = "1m",
    window_s: int = 60,
    final: bool = True,
) -> dict[str, Any]:
    """One valid SLI snapshot whose ``stages_ms`` have the given P99s (None: count 0)."""
    s = series or SERIES
    flat = _summary(200.0)
    snap = SliSnapshot(
        event_id=f"{s['service']}-{window}-{end_ms}-{final}",
        ts_ms=end_ms + 5_000,
        series=Series(**s),
        window=window,
        window_s=window_s,
        window_end_ms=end_ms,
        final=final,
        count=240,
        errors=0,
        ttft_ms=flat,
        tpot_ms=flat,
        itl_ms=flat,
        e2e_ms=flat,
        goodput_rps=4.0,
        slo_compliance=0.999,
        stages_ms={name: _summary(v) for name, v in stages.items()},
    )
    built: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(snap))
    return built


def breach(
    state: str,
    at_ms: int,
    *,
    opened_ms: int,
    resolved_ms: int | None = None,
    breach_id: str = "b-1",
    series: dict[str, str] | None = None,
    slo: str = "ttft-p99",
) -> dict[str, Any]:
    """One ``tailguard.breach.v1`` lifecycle record, shaped as the breach engine writes it."""
    return {
        "schema": "tailguard.breach.v1",
        "event_id": f"{breach_id}:{state}",
        "ts_ms": at_ms + 1_000,
        "breach_id": breach_id,
        "state": state,
        "seq": {"opened": 0, "updated": 1, "resolved": 2}[state],
        "kind": "burn_rate",
        "severity": "page",
        "slo": slo,
        "series": series or SERIES,
        "at_ms": at_ms,
        "burn_rates": {"1h": 20.0, "5m": 30.0},
        "sli": {},
        "budget_remaining": 0.4,
        "exemplars": [],
        "attribution": [],
        "gpu": [],
        "opened_ms": opened_ms,
        "resolved_ms": resolved_ms,
    }


@pytest.fixture
def make_snapshot() -> MakeSnapshot:
    return snapshot


@pytest.fixture
def make_breach() -> MakeBreach:
    return breach


def incident_minutes(n: int = 30) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``n`` final minutes; prefill P99 ~200 ms → ~1,500 ms during minutes 12–19,
    tokenize and decode flat; a breach open from 12:14 to 12:22."""
    snaps = []
    for m in range(n):
        bad = 12 <= m < 20
        wobble = (m % 5 - 2) / 100
        snaps.append(
            snapshot(
                T0_MS + (m + 1) * MINUTE_MS,
                {
                    "tokenize": 3.0 * (1 + wobble),
                    "queue": 15.0 * (1 + wobble) + (40.0 if bad else 0.0),
                    "prefill": (1_500.0 if bad else 200.0) * (1 + wobble),
                    "decode": 650.0 * (1 + wobble),
                    "detokenize": 1.2,
                },
            )
        )
    opened, resolved = T0_MS + 14 * MINUTE_MS, T0_MS + 22 * MINUTE_MS
    breaches = [
        breach("opened", opened, opened_ms=opened),
        breach("updated", opened + 2 * MINUTE_MS, opened_ms=opened),
        breach("resolved", resolved, opened_ms=opened, resolved_ms=resolved),
    ]
    return snaps, breaches


@pytest.fixture
def incident() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return incident_minutes()
