"""Warm-up requests stay out of SLO accounting (the SLI window state)."""

from typing import Any

from tailguard.streams import summarize

ONE_MINUTE = 60_000


def test_warmup_requests_are_excluded_from_slo_accounting(
    t0: int, make_event: Any, make_windows: Any
) -> None:
    windows = make_windows()
    slow_warm = [
        make_event(t0 + 1_000 + i, ttft_ms=1_200.0, e2e_ms=3_000.0, status="error", warmup=True)
        for i in range(5)
    ]
    fast = [make_event(t0 + 2_000 + i, ttft_ms=210.0, e2e_ms=900.0) for i in range(10)]
    windows.add(slow_warm + fast)
    bucket = windows.window(ONE_MINUTE)
    assert bucket.counters.warmup == 5
    assert bucket.counters.requests == 10 and bucket.counters.errors == 0
    summary = summarize(bucket, ONE_MINUTE, windows.thresholds)
    assert summary.count == 10
    assert summary.slo_compliance == 1.0
    assert summary.latency["ttft_ms"]["p99"] <= 210.0 + 1e-6
