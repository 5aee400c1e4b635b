"""Percentiles of merged windows against numpy's exact percentiles of the same samples.

A million lognormal requests are fed the way the agent feeds them (batches of
200, in event-time order with jitter inside the allowed lateness), so every
window digest is a merge of many bucket digests, each itself a merge of many
batch digests. The bound checked is 0.5 % relative error.
"""

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pytest
from tailguard.streams import PERCENTILES, WINDOWS, Bucket, RingConfig, SeriesWindows
from tailguard.streams.digest import Sketch

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
BATCH = 200

pytestmark = pytest.mark.slow

GAPS_PER_REQUEST = 2
REL_TOL = 0.005

# One seed for the whole file: the numbers below are reproducible run to run.
SEED = 20231114


@dataclass(frozen=True, slots=True)
class Fed:
    """A window state and the exact samples that its window under test must hold."""

    windows: SeriesWindows
    window: Bucket
    ttft: np.ndarray
    itl: np.ndarray


@contextmanager
def _no_gc() -> Iterator[None]:
    # Two million short-lived events: the cyclic collector only costs time here.
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _feed(
    windows: SeriesWindows,
    make: Callable[..., object],
    ts: np.ndarray,
    ttft: np.ndarray,
    gaps: np.ndarray,
) -> None:
    ts_l, ttft_l, gaps_l = ts.tolist(), ttft.tolist(), gaps.tolist()
    with _no_gc():
        for i in range(0, len(ts_l), BATCH):
            batch = [
                make(f"req-{j}", ts_l[j], "ok", ttft_l[j] + 900.0, ttft_l[j], 64, gaps_l[j])
                for j in range(i, min(i + BATCH, len(ts_l)))
            ]
            windows.add(batch)


def _samples(
    rng: np.random.Generator, n: int, lo_ms: int, hi_ms: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrival times in ``[lo, hi)`` (sorted, then jittered ±20 s) and lognormal latencies."""
    ts = np.sort(rng.integers(lo_ms, hi_ms, n))
    ts = np.clip(ts + rng.integers(-20_000, 20_000, n), lo_ms, hi_ms - 1)
    ttft = rng.lognormal(np.log(300.0), 0.6, n)
    gaps = rng.lognormal(np.log(40.0), 0.5, (n, GAPS_PER_REQUEST))
    return ts, ttft, gaps


@pytest.fixture(scope="module")
def fifty_minutes(t0: int, event_type: Callable[..., object]) -> Fed:
    """10^6 requests spread over 50 minute buckets of one hour; the 1 h window holds them all."""
    rng = np.random.default_rng(SEED)
    ts, ttft, gaps = _samples(rng, 1_000_000, t0, t0 + 50 * MINUTE_MS)
    windows = SeriesWindows()
    _feed(windows, event_type, ts, ttft, gaps)
    return Fed(windows, windows.window(WINDOWS["1h"]), ttft, gaps.ravel())


@pytest.fixture(scope="module")
def five_hours(t0: int, event_type: Callable[..., object]) -> Fed:
    """Requests over [t0 + 50 min, t0 + 5 h 50 min); the 6 h window ends at t0 + 6 h 51 min.

    The window starts at t0 + 51 min, so hour t0 is not wholly inside and its
    minute buckets are pruned by then: the window holds exactly the requests
    from t0 + 1 h on, four of its hours as roll-ups and the last as minutes.
    """
    rng = np.random.default_rng(SEED + 1)
    ts, ttft, gaps = _samples(rng, 1_040_000, t0 + 50 * MINUTE_MS, t0 + 350 * MINUTE_MS)
    windows = SeriesWindows()
    _feed(windows, event_type, ts, ttft, gaps)
    inside = ts >= t0 + HOUR_MS
    window = windows.window(WINDOWS["6h"], end_ms=t0 + 6 * HOUR_MS + 51 * MINUTE_MS)
    return Fed(windows, window, ttft[inside], gaps[inside].ravel())


def _errors(window: Bucket, metric: str, exact: np.ndarray) -> dict[str, float]:
    """Relative error of the window's estimate of each published percentile."""
    digest = window.digests[metric]
    truth = np.quantile(exact, list(PERCENTILES.values()))
    return {
        name: abs(digest.quantile(q) - t) / t
        for (name, q), t in zip(PERCENTILES.items(), truth.tolist(), strict=True)
    }


def _assert_within_tolerance(errors: dict[str, float]) -> None:
    table = ", ".join(f"{name} {error:.3%}" for name, error in errors.items())
    assert max(errors.values()) <= REL_TOL, f"relative errors: {table}"


METRICS = [("ttft_ms", "ttft"), ("itl_ms", "itl")]


# ---------------------------------------------------------------- 50 minute buckets


def test_the_one_hour_window_is_a_merge_of_fifty_minute_buckets(fifty_minutes: Fed) -> None:
    assert len(fifty_minutes.windows.fine) == 50
    assert fifty_minutes.windows.coarse == {}
    counters = fifty_minutes.window.counters
    assert counters.requests == counters.ttft_total == 1_000_000
    assert counters.itl_total == 1_000_000 * GAPS_PER_REQUEST
    assert fifty_minutes.windows.late == fifty_minutes.windows.duplicates == 0


@pytest.mark.parametrize(("metric", "exact"), METRICS)
def test_merged_minute_buckets_give_p50_to_p999_within_half_a_percent(
    fifty_minutes: Fed, metric: str, exact: str
) -> None:
    _assert_within_tolerance(_errors(fifty_minutes.window, metric, getattr(fifty_minutes, exact)))


# ---------------------------------------------------------------- hourly roll-up


def test_five_hours_of_requests_are_rolled_up_into_hour_buckets(five_hours: Fed, t0: int) -> None:
    windows = five_hours.windows
    # Hours t0 … t0+4h have closed (watermark ≈ t0 + 5 h 50 min); hour t0+5h is still open.
    assert sorted(windows.coarse) == [t0 + k * HOUR_MS for k in range(5)]
    assert windows.watermark_ms is not None
    # Minute buckets older than 2 h are gone: hours t0…t0+2h exist only as roll-ups.
    assert min(windows.fine) >= windows.watermark_ms - 2 * HOUR_MS
    assert min(windows.fine) > t0 + 3 * HOUR_MS


def test_six_hour_window_holds_exactly_the_requests_of_the_hours_inside(five_hours: Fed) -> None:
    counters = five_hours.window.counters
    assert len(five_hours.ttft) >= 1_000_000
    assert counters.requests == counters.ttft_total == len(five_hours.ttft)
    assert counters.itl_total == len(five_hours.itl)
    assert five_hours.window.digests["ttft_ms"].n_values == len(five_hours.ttft)


@pytest.mark.parametrize(("metric", "exact"), METRICS)
def test_rolled_up_six_hour_window_gives_p50_to_p999_within_half_a_percent(
    five_hours: Fed, metric: str, exact: str
) -> None:
    _assert_within_tolerance(_errors(five_hours.window, metric, getattr(five_hours, exact)))


# ---------------------------------------------------------------- across samples


def test_rolled_up_window_keeps_percentiles_within_half_a_percent_on_every_sample() -> None:
    """The bound must hold for any sample, not only the one the ring tests above draw.

    This replays the digest side of the ring without its per-event Python loop,
    with the default ``RingConfig``: each of 300 minute buckets digests its
    values 200 at a time (``Bucket.absorb``), hours 0-3 are rolled up
    (``SeriesWindows._advance``) and the window merges the four roll-ups and the
    60 minutes of hour 4 (``SeriesWindows.window``). Six samples: with
    300-centroid roll-ups, sample 5 was the one that broke the bound (P99.9
    0.65 %).
    """
    cfg = RingConfig()
    per_minute = 3_400
    worst = dict.fromkeys(PERCENTILES, 0.0)
    for seed in range(6):
        values = np.random.default_rng(seed).lognormal(np.log(300.0), 0.6, 300 * per_minute)
        window = Bucket.empty(0)
        for hour in range(5):
            rolled = Bucket.empty(hour * HOUR_MS)
            for minute in range(hour * 60, hour * 60 + 60):
                bucket = Bucket.empty(minute * MINUTE_MS)
                lo, hi = minute * per_minute, (minute + 1) * per_minute
                sketch = bucket.digests.setdefault("ttft_ms", Sketch(cfg.max_centroids))
                for i in range(lo, hi, BATCH):
                    sketch.add(values[i : min(i + BATCH, hi)])
                rolled.merge(bucket, cfg.coarse_max_centroids)
                if hour == 4:
                    window.merge(bucket, cfg.max_centroids)
            if hour < 4:
                window.merge(rolled, cfg.max_centroids)
        for name, error in _errors(window, "ttft_ms", values).items():
            worst[name] = max(worst[name], error)
    _assert_within_tolerance(worst)
