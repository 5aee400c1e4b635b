"""Cause flags, per-cause counters, stage digests and their ranking."""

from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np
import pytest
from tailguard.schemas import InferenceEvent
from tailguard.streams import Thresholds, summarize
from tailguard.streams.attribution import (
    FACTORS,
    factor_flags,
    rank_causes,
    stage_increases,
)
from tailguard.streams.columns import Columns
from tailguard.streams.fold import fold_many

from tests.unit.streams.conftest import MINUTE_MS, MakeEvent, MakeWindows


def cause(**fields: Any) -> SimpleNamespace:
    base = {"prefix_hit_tokens": 0, "prefix_query_tokens": 0, "wait_ms": None}
    base.update(timed_out=False, throttled=False)
    base.update(fields)
    return SimpleNamespace(**base)


def test_flags_follow_the_documented_thresholds() -> None:
    events = [
        SimpleNamespace(cache=cause(prefix_hit_tokens=499, prefix_query_tokens=1000)),  # miss
        SimpleNamespace(cache=cause(prefix_hit_tokens=500, prefix_query_tokens=1000)),  # hit
        SimpleNamespace(cache=cause(prefix_hit_tokens=0, prefix_query_tokens=0)),  # no prefix
        SimpleNamespace(batch=cause(wait_ms=100.0)),  # waited at the threshold
        SimpleNamespace(batch=cause(wait_ms=99.0)),
        SimpleNamespace(batch=cause(wait_ms=None, timed_out=True)),
        SimpleNamespace(flow_control=cause(throttled=True)),
        SimpleNamespace(
            cache=cause(prefix_hit_tokens=1, prefix_query_tokens=10),
            batch=cause(timed_out=True),
            flow_control=cause(throttled=True),
        ),
        SimpleNamespace(),
    ]
    assert factor_flags(events).tolist() == [1, 0, 0, 2, 0, 2, 4, 7, 0]


def test_flags_read_validated_inference_events() -> None:
    ev = msgspec.convert(
        {
            "event_id": "e",
            "ts_ms": 1,
            "service": "s",
            "model": "m",
            "status": "ok",
            "e2e_ms": 10.0,
            "cache": {"prefix_hit_tokens": 7, "prefix_query_tokens": 100},
            "batch": {"size": 2, "wait_ms": 350.0, "timed_out": True},
            "flow_control": {"throttled": False},
        },
        InferenceEvent,
    )
    assert factor_flags([ev]).tolist() == [3]


def _events(t0: int, make_event: MakeEvent) -> list[Any]:
    """Ten ok requests: four slow ones with a cache miss (two also batch-waited), six fast."""
    out = []
    for i in range(10):
        slow = i < 4
        ttft = 1_500.0 if slow else 100.0 + i
        out.append(
            make_event(
                t0 + 1_000 * i,
                ttft_ms=ttft,
                e2e_ms=ttft + 300.0,  # TPOT 30 ms: only TTFT decides
                output_tokens=11,
                cache=cause(prefix_hit_tokens=0 if slow else 90, prefix_query_tokens=100),
                batch=cause(wait_ms=400.0 if i < 2 else 1.0),
                flow_control=cause(throttled=i == 9),
                stages_ms={"prefill": 1_400.0 if slow else 80.0, "queue": 5.0 + i},
            )
        )
    return out


def _check_counts(windows: Any, t0: int) -> None:
    c = windows.window(MINUTE_MS, t0 + MINUTE_MS).counters
    assert (c.requests, c.good_requests) == (10, 6)
    assert c.factor_row(0) == (4, 4, 4, 4 * 1_500_000)
    assert c.factor_row(1) == (2, 2, 2, 2 * 1_500_000)
    assert c.factor_row(2) == (1, 0, 1, 109_000)
    assert c.ttft_sum_us == 4 * 1_500_000 + sum(100_000 + 1_000 * i for i in range(4, 10))


def test_a_window_counts_each_cause_among_all_and_among_the_violating_requests(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    windows.add(_events(t0, make_event))
    _check_counts(windows, t0)


def test_the_batched_fold_counts_causes_and_stages_like_the_per_series_fold(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    events = _events(t0, make_event)
    alone, batched = make_windows(), make_windows()
    alone.add(events)
    fold_many([batched], Columns.from_events(events), np.array([0, len(events)]))
    _check_counts(batched, t0)
    a = alone.window(MINUTE_MS, t0 + MINUTE_MS)
    b = batched.window(MINUTE_MS, t0 + MINUTE_MS)
    assert a.to_bytes() == b.to_bytes()


def test_stage_digests_appear_in_the_window_summary(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    windows.add(_events(t0, make_event))
    s = summarize(windows.window(MINUTE_MS, t0 + MINUTE_MS), MINUTE_MS, Thresholds())
    assert sorted(s.stages) == ["prefill", "queue"]
    assert s.stages["prefill"]["count"] == 10
    assert s.stages["prefill"]["p99"] == pytest.approx(1_400.0)
    assert s.stages["queue"]["p50"] == pytest.approx(9.5)


def test_causes_rank_by_their_share_of_the_violating_requests(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    windows = make_windows()
    windows.add(_events(t0, make_event))
    c = windows.window(MINUTE_MS, t0 + MINUTE_MS).counters
    ranked = rank_causes(c, baseline_rates=[0.02, 0.01, 0.1])
    assert [r.cause for r in ranked] == ["prefix_cache_miss", "batch_wait"]  # throttled: 0 bad
    miss, wait = ranked
    assert (miss.share, miss.bad_with, miss.bad) == (1.0, 4, 4)
    assert miss.rate == pytest.approx(0.4)
    assert miss.lift == pytest.approx(0.4 / 0.02)
    assert miss.ttft_affected_ms == pytest.approx(1_500.0)
    assert miss.ttft_unaffected_ms == pytest.approx(sum(100.0 + i for i in range(4, 10)) / 6)
    assert wait.share == 0.5
    assert set(miss.as_dict()) >= {"cause", "share", "lift", "ttft_affected_ms"}


def test_no_violating_request_means_no_cause() -> None:
    quiet = SimpleNamespace(requests=10, errors=0, cancelled=0, good_requests=10)
    assert rank_causes(quiet) == []


def test_stages_rank_by_p99_increase_and_a_new_stage_counts_from_zero() -> None:
    rows = stage_increases(
        {"prefill": 1_500.0, "queue": 400.0, "decode": 900.0, "spill": 50.0},
        {"prefill": 200.0, "queue": 20.0, "decode": 880.0},
    )
    assert [r["stage"] for r in rows] == ["prefill", "queue", "spill"]
    assert rows[0]["increase_ms"] == 1_300.0 and rows[0]["ratio"] == 7.5
    assert rows[2]["baseline_p99_ms"] is None


def test_the_factor_names_are_the_published_contract() -> None:
    assert FACTORS == ("prefix_cache_miss", "batch_wait", "throttled")
