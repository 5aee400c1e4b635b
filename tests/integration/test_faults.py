"""Faults on the real broker: generated bad input at volume, and a second worker taking over."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration

GOOD = {
    "event_id": "x",
    "service": "fuzz",
    "model": "m",
    "status": "ok",
    "e2e_ms": 300.0,
    "ttft_ms": 120.0,
    "output_tokens": 4,
    "itl_ms": [20.0, 21.0, 22.0],
}
NOT_UTF8 = b'{"event_id": "\xff\xfe'
WRONG: dict[str, Any] = {
    "event_id": [1],
    "service": 5,
    "model": {"a": 1},
    "status": "exploded",
    "e2e_ms": "slow",
    "ttft_ms": "fast",
    "output_tokens": "many",
    "itl_ms": "gaps",
}


def bad_message_strategy(now_ms: int) -> st.SearchStrategy[bytes]:
    """Messages that must each be refused: broken JSON, wrong types, NaN and negative
    durations, huge arrays, deep nesting, invalid UTF-8, future timestamps, unknown
    schema versions, missing fields."""

    def event(**changes: Any) -> dict[str, Any]:
        ev = {**GOOD, "ts_ms": now_ms - 60_000, **changes}
        return {k: v for k, v in ev.items() if v is not ...}

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, allow_nan=True).encode()

    text = st.text(max_size=30)
    return st.one_of(
        st.binary(min_size=1, max_size=64).filter(lambda b: not _is_json(b)),
        text.map(lambda t: ("{" + t).encode()),
        st.sampled_from(sorted(WRONG)).map(lambda f: dumps(event(**{f: WRONG[f]}))),
        st.sampled_from([math.nan, math.inf, -math.inf]).map(lambda v: dumps(event(e2e_ms=v))),
        st.floats(max_value=-0.001, allow_nan=False).map(lambda v: dumps(event(ttft_ms=v))),
        st.integers(10_001, 10_050).map(lambda n: b"[" + b",".join([b"0"] * n) + b"]"),
        st.integers(40, 200).map(lambda d: b"[" * d + b"]" * d),
        st.binary(min_size=1, max_size=8).map(lambda b: NOT_UTF8 + b + b'"}'),
        st.integers(600_000, 10**9).map(lambda d: dumps(event(ts_ms=now_ms + d))),
        st.integers(2, 99).map(lambda v: dumps(event(schema=f"tailguard.inference.v{v}"))),
        st.sampled_from(["event_id", "ts_ms", "service", "status", "e2e_ms"]).map(
            lambda f: dumps(event(**{f: ...}))
        ),
    )


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return False
    return True


def test_ten_thousand_generated_bad_messages_are_all_dead_lettered_and_valid_events_count(
    namespace: Any,
    worker_factory: Callable[..., Any],
    collector: Callable[[str], Any],
    produce: Callable[..., list[tuple[int, int]]],
) -> None:
    now = int(time.time() * 1000)
    bad: list[bytes] = []

    @settings(
        max_examples=10_000, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(bad_message_strategy(now))
    def gather(raw: bytes) -> None:
        bad.append(raw)

    gather()
    assert len(bad) >= 10_000
    valid_events = []
    messages: list[tuple[bytes | None, bytes]] = []
    for i, raw in enumerate(bad):
        messages.append((b"bad", raw))
        if i % 10 == 0:
            ev = {**GOOD, "event_id": f"ok-{i}", "ts_ms": now - 120_000 + i}
            valid_events.append(ev)
            messages.append((b"ok", json.dumps(ev).encode()))
    positions = produce(namespace.broker, namespace.topic("tailguard.inference"), messages)
    bad_positions = {positions[i] for i, (k, _) in enumerate(messages) if k == b"bad"}

    worker = worker_factory("fuzz").start()
    dead = collector("tailguard.deadletter")
    dead.wait_for(
        lambda r: {(x["partition"], x["offset"]) for x in r} >= bad_positions,
        timeout=600,
        worker=worker,
    )
    sli = collector("tailguard.sli")
    sli.wait_for(
        lambda r: any(
            x["series"]["service"] == "fuzz"
            and x["window"] == "1h"
            and x["count"] == len(valid_events)
            for x in r
        ),
        timeout=120,
        worker=worker,
    )
    assert worker.alive(), "no bad message stops the worker"
    assert all(x["reason"] and x["detail"] for x in dead.records)
    reasons = {x["reason"] for x in dead.records}
    assert len(reasons) >= 8, reasons
    dead_positions = {(x["partition"], x["offset"]) for x in dead.records}
    assert dead_positions == bad_positions, "only bad messages are dead-lettered"
