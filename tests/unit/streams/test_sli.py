"""SLI definitions (vLLM ``bench serve`` / DistServe) and the validation of their configuration."""

import math
from collections.abc import Callable
from typing import Any

import pytest
from tailguard.streams import (
    WINDOWS,
    ConfigError,
    RingConfig,
    SeriesWindows,
    StreamsError,
    Thresholds,
    summarize,
    summarize_many,
)
from tailguard.streams.sli import tpot_ms
from tailguard.streams.summary import PERCENTILES

MakeEvent = Callable[..., Any]
MakeWindows = Callable[..., SeriesWindows]
ONE_MINUTE = WINDOWS["1m"]


@pytest.fixture
def one_minute(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> Callable[..., SeriesWindows]:
    """``one_minute(*fields, thresholds=None)``: a ring holding one request per field dict."""

    def feed(*fields: dict[str, Any], thresholds: Thresholds | None = None) -> SeriesWindows:
        windows = make_windows(thresholds)
        windows.add([make_event(t0 + 1_000 + i, **f) for i, f in enumerate(fields)])
        return windows

    return feed


# ------------------------------------------------------------------ TPOT


@pytest.mark.parametrize(
    ("e2e", "ttft", "out", "want"),
    [
        (1_100.0, 100.0, 11, 100.0),
        (1_100.0, 100.0, 2, 1_000.0),
        (1_100.0, 100.0, 1, None),
        (1_100.0, 100.0, 0, None),
        (1_100.0, 100.0, None, None),
        (1_100.0, None, 11, None),
    ],
)
def test_tpot_is_decode_time_over_tokens_after_the_first_only_for_more_than_one_token(
    e2e: float, ttft: float | None, out: int | None, want: float | None
) -> None:
    assert tpot_ms(e2e, ttft, out) == want


def test_tpot_digest_holds_only_requests_with_more_than_one_output_token(
    one_minute: Callable[..., SeriesWindows],
) -> None:
    windows = one_minute(
        {"e2e_ms": 1_100.0, "ttft_ms": 100.0, "output_tokens": 11},
        {"e2e_ms": 1_100.0, "ttft_ms": 100.0, "output_tokens": 1},
        {"e2e_ms": 1_100.0, "ttft_ms": 100.0, "output_tokens": None},
    )
    tpot = windows.window(ONE_MINUTE).digests["tpot_ms"]
    assert tpot.n_values == 1
    assert tpot.quantile(0.5) == pytest.approx(100.0)


# ------------------------------------------------------------------ errors, cancelled, warm-up


@pytest.mark.parametrize(
    ("status", "errors", "cancelled"),
    [("ok", 0, 0), ("error", 1, 0), ("timeout", 1, 0), ("rejected", 1, 0), ("cancelled", 0, 1)],
)
def test_error_statuses_count_as_errors_and_cancelled_does_not(
    one_minute: Callable[..., SeriesWindows], status: str, errors: int, cancelled: int
) -> None:
    counters = one_minute({"status": status}).counters(ONE_MINUTE)
    assert (counters.requests, counters.errors, counters.cancelled) == (1, errors, cancelled)


def test_failed_and_cancelled_requests_add_no_latency_samples(
    one_minute: Callable[..., SeriesWindows],
) -> None:
    windows = one_minute(
        {"status": "error", "itl_ms": [10.0]}, {"status": "cancelled", "itl_ms": [10.0]}
    )
    window = windows.window(ONE_MINUTE)
    assert window.digests == {}
    assert (window.counters.ttft_total, window.counters.itl_total) == (0, 0)


def test_success_rate_counts_errors_but_not_cancellations(
    one_minute: Callable[..., SeriesWindows],
) -> None:
    statuses = ["ok"] * 7 + ["error", "cancelled", "cancelled"]
    windows = one_minute(*({"status": s} for s in statuses))
    summary = summarize(windows.window(ONE_MINUTE), ONE_MINUTE, windows.thresholds)
    assert (summary.count, summary.errors, summary.cancelled) == (10, 1, 2)
    assert summary.success_rate == pytest.approx(0.9)


def test_warm_up_requests_are_excluded_from_requests_and_digests(
    one_minute: Callable[..., SeriesWindows],
) -> None:
    windows = one_minute(
        {"warmup": True, "ttft_ms": 5_000.0, "itl_ms": [500.0], "trace_id": "a" * 32},
        {"warmup": None, "ttft_ms": 100.0},
        {"warmup": True, "status": "error"},
    )
    window = windows.window(ONE_MINUTE)
    counters = window.counters
    assert (counters.requests, counters.warmup, counters.errors) == (1, 2, 0)
    assert window.digests["ttft_ms"].n_values == 1
    assert window.digests["ttft_ms"].max() == 100.0
    assert "itl_ms" not in window.digests
    assert window.exemplars == []
    assert (counters.ttft_total, counters.good_requests) == (1, 1)


# ------------------------------------------------------------------ ITL per gap


def test_itl_compliance_is_counted_per_gap_not_per_request(
    one_minute: Callable[..., SeriesWindows],
) -> None:
    windows = one_minute({"itl_ms": [50.0, 120.0, 120.5, 300.0]}, {"itl_ms": [10.0]})
    window = windows.window(ONE_MINUTE)
    assert (window.counters.itl_total, window.counters.itl_good) == (5, 3)
    assert window.digests["itl_ms"].n_values == 5
    summary = summarize(window, ONE_MINUTE, windows.thresholds)
    assert summary.itl_compliance == pytest.approx(3 / 5)
    assert summary.latency["itl_ms"]["count"] == 5


# ------------------------------------------------------------------ goodput


GOOD = {"status": "ok", "ttft_ms": 800.0, "e2e_ms": 800.0 + 120.0 * 10, "output_tokens": 11}


@pytest.mark.parametrize(
    ("change", "e2e_threshold", "good"),
    [
        ({}, None, True),  # every threshold met exactly (≤ is good)
        ({"ttft_ms": 800.5}, None, False),
        ({"e2e_ms": 800.0 + 120.5 * 10}, None, False),  # TPOT 120.5 ms > 120 ms
        ({"status": "error"}, None, False),
        ({"status": "cancelled"}, None, False),
        ({}, 2_000.0, True),
        ({}, 1_999.0, False),  # E2E 2 000 ms over a set E2E threshold
        ({"itl_ms": [10.0, 400.0]}, None, True),  # one slow gap: TPOT still 120 ms
        ({"output_tokens": 1, "e2e_ms": 5_000.0}, None, True),  # TPOT undefined
        ({"ttft_ms": None, "output_tokens": 0}, None, True),
    ],
    ids=[
        "all-met",
        "ttft-over",
        "tpot-over",
        "error",
        "cancelled",
        "e2e-met",
        "e2e-over",
        "slow-gap-but-tpot-met",
        "single-token",
        "no-token",
    ],
)
def test_goodput_counts_only_ok_requests_meeting_every_threshold(
    one_minute: Callable[..., SeriesWindows],
    change: dict[str, Any],
    e2e_threshold: float | None,
    good: bool,
) -> None:
    thresholds = Thresholds(ttft_ms=800.0, itl_ms=120.0, e2e_ms=e2e_threshold)
    windows = one_minute({**GOOD, **change}, thresholds=thresholds)
    assert windows.counters(ONE_MINUTE).good_requests == int(good)


def test_goodput_rps_is_good_requests_per_second_of_the_window(
    one_minute: Callable[..., SeriesWindows],
) -> None:
    windows = one_minute(GOOD, GOOD, GOOD, {**GOOD, "ttft_ms": 900.0})
    summary = summarize(windows.window(WINDOWS["5m"]), WINDOWS["5m"], windows.thresholds)
    assert summary.goodput_rps == pytest.approx(3 / 300)


# ------------------------------------------------------------------ composite SLI


def test_slo_compliance_is_point_seven_ttft_plus_point_three_itl(
    one_minute: Callable[..., SeriesWindows],
) -> None:
    # TTFT: 7 of 10 requests ≤ 800 ms. ITL: 16 of 20 gaps ≤ 120 ms.
    fields = [
        {"ttft_ms": 100.0 if i < 7 else 900.0, "itl_ms": [50.0, 50.0 if i < 6 else 200.0]}
        for i in range(10)
    ]
    windows = one_minute(*fields)
    summary = summarize(windows.window(ONE_MINUTE), ONE_MINUTE, windows.thresholds)
    assert summary.ttft_compliance == pytest.approx(0.7)
    assert summary.itl_compliance == pytest.approx(0.8)
    assert summary.slo_compliance == pytest.approx(0.7 * 0.7 + 0.3 * 0.8)


def test_slo_compliance_uses_the_series_weights(one_minute: Callable[..., SeriesWindows]) -> None:
    thresholds = Thresholds(ttft_weight=0.5, itl_weight=0.5)
    windows = one_minute({"ttft_ms": 900.0, "itl_ms": [10.0]}, thresholds=thresholds)
    summary = summarize(windows.window(ONE_MINUTE), ONE_MINUTE, thresholds)
    assert summary.slo_compliance == pytest.approx(0.5 * 0.0 + 0.5 * 1.0)


def test_a_window_without_samples_is_compliant_and_has_no_percentiles(
    make_windows: MakeWindows,
) -> None:
    windows = make_windows()
    summary = summarize(windows.window(ONE_MINUTE), ONE_MINUTE, windows.thresholds)
    assert (summary.count, summary.success_rate, summary.slo_compliance) == (0, 1.0, 1.0)
    assert summary.goodput_rps == 0.0
    assert all(row["count"] == 0 and row["p99"] is None for row in summary.latency.values())


def test_summary_publishes_every_percentile_of_every_metric(
    one_minute: Callable[..., SeriesWindows],
) -> None:
    windows = one_minute(
        {"e2e_ms": 1_100.0, "ttft_ms": 100.0, "output_tokens": 11, "itl_ms": [100.0]}
    )
    summary = summarize(windows.window(ONE_MINUTE), ONE_MINUTE, windows.thresholds)
    assert set(summary.latency) == {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"}
    for metric, value in [
        ("ttft_ms", 100.0),
        ("tpot_ms", 100.0),
        ("itl_ms", 100.0),
        ("e2e_ms", 1_100.0),
    ]:
        row = summary.latency[metric]
        assert set(row) == {"count", "p50", "p90", "p95", "p99", "p999"}
        assert row["count"] == 1
        assert row["p50"] == row["p999"] == pytest.approx(value)


def test_a_row_holds_the_count_then_each_named_percentile_in_order(
    one_minute: Callable[..., SeriesWindows], make_windows: MakeWindows
) -> None:
    windows = one_minute(*({"ttft_ms": float(v)} for v in range(1, 1_001)))
    window = windows.window(ONE_MINUTE)
    row = summarize(window, ONE_MINUTE, windows.thresholds).latency["ttft_ms"]
    assert list(row) == ["count", *PERCENTILES]
    assert row["count"] == 1_000
    sketch = window.digests["ttft_ms"]
    assert [row[name] for name in PERCENTILES] == sketch.quantiles(list(PERCENTILES.values()))
    assert row["p50"] < row["p90"] < row["p95"] < row["p99"] < row["p999"]
    nothing = make_windows()
    empty = summarize(nothing.window(ONE_MINUTE), ONE_MINUTE, nothing.thresholds).latency
    assert empty["ttft_ms"] == dict.fromkeys(["count", *PERCENTILES]) | {"count": 0}


def test_windows_summarised_together_match_each_summarised_alone(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    # Series of different sizes (exact and digest sketches, one with no requests),
    # each with its own weights, some with stage latencies.
    reads = []
    for n, weight in [(0, 0.7), (1, 0.5), (40, 0.7), (400, 0.2)]:
        thresholds = Thresholds(ttft_weight=weight, itl_weight=1.0 - weight)
        windows = make_windows(thresholds)
        windows.add(
            [
                make_event(
                    t0 + 1_000 + i,
                    ttft_ms=50.0 + i,
                    itl_ms=[10.0 + i % 7, 20.0],
                    stages_ms={"prefill": 5.0 + i} if i % 2 else {},
                )
                for i in range(n)
            ]
        )
        for window in ("1m", "5m"):
            reads.append(
                (windows.window(WINDOWS[window], t0 + ONE_MINUTE), WINDOWS[window], thresholds)
            )
    together = summarize_many(reads)
    assert together == [summarize(bucket, ms, th) for bucket, ms, th in reads]
    assert together[-1].latency["itl_ms"]["count"] == 800 and together[-1].stages


def test_windows_sharing_one_merged_bucket_are_summarised_as_each_alone(
    t0: int, make_event: MakeEvent, make_windows: MakeWindows
) -> None:
    # A young series' 1m, 5m and 1h windows are one merged bucket: summarised once,
    # each window's summary differs in its length and the goodput over it only;
    # other weights give their own compliance.
    heavy, light = Thresholds(ttft_weight=0.9, itl_weight=0.1), Thresholds()
    windows = make_windows(heavy)
    windows.add([make_event(t0 + 1_000 + i, ttft_ms=50.0 + 40 * i) for i in range(30)])
    bucket = windows.window(ONE_MINUTE, t0 + ONE_MINUTE)
    reads = [
        (bucket, ONE_MINUTE, heavy),
        (bucket, WINDOWS["5m"], heavy),
        (bucket, WINDOWS["1h"], heavy),
        (bucket, WINDOWS["5m"], light),
        (bucket, ONE_MINUTE, heavy),
    ]
    together = summarize_many(reads)
    assert together == [summarize(b, ms, th) for b, ms, th in reads]
    assert len({s.goodput_rps for s in together}) == 3
    assert together[0].slo_compliance != together[3].slo_compliance


def test_exemplars_are_the_trace_ids_of_the_slowest_requests(
    one_minute: Callable[..., SeriesWindows],
) -> None:
    e2e = [300.0, 9_000.0, 100.0, 7_000.0, 50.0, 8_000.0, 6_000.0, 200.0]
    windows = one_minute(*({"e2e_ms": v, "trace_id": f"{int(v):032x}"} for v in e2e))
    summary = summarize(windows.window(ONE_MINUTE), ONE_MINUTE, windows.thresholds)
    assert summary.exemplars == [f"{v:032x}" for v in (9_000, 8_000, 7_000, 6_000, 300)]


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"bucket_ms": 0}, "bucket_ms"),
        ({"bucket_ms": -60_000}, "bucket_ms"),
        ({"rollup_ms": 90_000}, "rollup_ms"),
        ({"allowed_lateness_ms": -1}, "allowed_lateness_ms"),
        ({"fine_retention_ms": 3_600_000}, "fine_retention_ms"),
        ({"retention_ms": 3_600_000}, "retention_ms"),
        ({"max_centroids": 19}, "max_centroids"),
        ({"max_centroids": 10_001}, "max_centroids"),
    ],
)
def test_ring_config_rejects_values_that_cannot_work_naming_the_field(
    config: dict[str, int], field: str
) -> None:
    with pytest.raises(ConfigError, match=field):
        RingConfig(**config)


@pytest.mark.parametrize("rollup_ms", [0, -3_600_000])
def test_ring_config_rejects_a_roll_up_period_that_is_not_positive(rollup_ms: int) -> None:
    with pytest.raises(ConfigError, match="rollup_ms"):
        RingConfig(rollup_ms=rollup_ms)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"ttft_ms": 0.0}, "ttft_ms"),
        ({"ttft_ms": -1.0}, "ttft_ms"),
        ({"ttft_ms": math.nan}, "ttft_ms"),
        ({"itl_ms": 0.0}, "itl_ms"),
        ({"itl_ms": math.nan}, "itl_ms"),
        ({"e2e_ms": 0.0}, "e2e_ms"),
        ({"e2e_ms": math.nan}, "e2e_ms"),
        ({"ttft_weight": 0.6, "itl_weight": 0.3}, "weight"),
    ],
)
def test_thresholds_reject_values_that_cannot_work_naming_the_field(
    config: dict[str, float], field: str
) -> None:
    with pytest.raises(ConfigError, match=field):
        Thresholds(**config)


@pytest.mark.parametrize(
    ("ttft_weight", "itl_weight"),
    [(math.nan, 0.3), (0.7, math.nan), (1.5, -0.5)],
    ids=["nan-ttft-weight", "nan-itl-weight", "negative-itl-weight"],
)
def test_thresholds_reject_weights_outside_zero_to_one(
    ttft_weight: float, itl_weight: float
) -> None:
    with pytest.raises(ConfigError, match="weight"):
        Thresholds(ttft_weight=ttft_weight, itl_weight=itl_weight)


def test_config_errors_are_value_errors_of_the_streams_package() -> None:
    with pytest.raises(ValueError) as caught:
        RingConfig(bucket_ms=0)
    assert isinstance(caught.value, StreamsError)


def test_the_default_configuration_is_the_spec_default() -> None:
    thresholds = Thresholds()
    assert (thresholds.ttft_ms, thresholds.itl_ms, thresholds.e2e_ms) == (800.0, 120.0, None)
    assert (thresholds.ttft_weight, thresholds.itl_weight) == (0.7, 0.3)
    assert RingConfig().bucket_ms == 60_000
