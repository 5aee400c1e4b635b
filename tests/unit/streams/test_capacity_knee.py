"""The throughput knee (Kneedle) on synthetic curves with a known knee."""

import numpy as np
import pytest
from tailguard.streams.knee import KneeConfig, KneeTracker, LoadSample, find_knee


def curve(
    knee: float, *, top: float, n: int = 60, seed: int = 1, noise: float = 0.03
) -> list[LoadSample]:
    """Flat P95 up to ``knee``, then a steep rise (queueing), with multiplicative noise."""
    rng = np.random.default_rng(seed)
    out = []
    for i, c in enumerate(np.linspace(top / n, top, n)):
        base = 300.0 + 20.0 * c / knee
        p95 = base if c <= knee else base + 900.0 * ((c - knee) / knee) ** 1.5 * 4
        p95 *= 1 + noise * rng.standard_normal()
        out.append(LoadSample(i * 10_000, float(c), float(p95), float(min(c, knee) * 50)))
    return out


@pytest.mark.parametrize(
    ("knee", "top", "seed"), [(8.0, 16.0, 1), (20.0, 32.0, 2), (50.0, 120.0, 3), (3.0, 6.0, 4)]
)
def test_knee_is_found_within_ten_percent_of_the_true_knee(
    knee: float, top: float, seed: int
) -> None:
    found = find_knee(curve(knee, top=top, seed=seed))
    assert found.concurrency is not None
    assert abs(found.concurrency - knee) <= 0.1 * knee, found


def test_knee_of_a_hockey_stick_curve_is_its_corner() -> None:
    samples = [
        LoadSample(i, c, 200.0 if c <= 12 else 200.0 + 150.0 * (c - 12), 1.0)
        for i, c in enumerate(float(c) for c in range(1, 31))
    ]
    found = find_knee(samples)
    assert found.concurrency == pytest.approx(12.0, rel=0.1)


def test_too_few_samples_claims_no_knee() -> None:
    found = find_knee(curve(8.0, top=16.0)[:5])
    assert found.concurrency is None
    assert found.reason.startswith("too_few_samples")


def test_a_curve_that_never_rises_claims_no_knee() -> None:
    flat = [LoadSample(i, float(i + 1), 300.0, 10.0) for i in range(30)]
    assert find_knee(flat).reason == "latency_never_rises"


def test_load_only_at_one_level_claims_no_knee() -> None:
    same = [LoadSample(i, 4.0 + 0.01 * i, 300.0 + i, 10.0) for i in range(30)]
    assert find_knee(same).reason.startswith("too_few_bins")


def test_tracker_publishes_a_knee_once_and_again_only_when_it_moves() -> None:
    tracker = KneeTracker(KneeConfig(history=60))
    published = [k for s in curve(8.0, top=16.0) if (k := tracker.add(s)) is not None]
    assert published
    assert abs(published[-1].concurrency - 8.0) <= 0.8  # type: ignore[operator]
    # More of the same curve: no new publication.
    again = [k for s in curve(8.0, top=16.0, seed=9) if (k := tracker.add(s)) is not None]
    assert again == [] or all(abs(k.concurrency - 8.0) <= 0.8 for k in again)  # type: ignore[operator]
    # Traffic changes (a faster deployment): the knee follows.
    moved = [k for s in curve(16.0, top=32.0, seed=5) if (k := tracker.add(s)) is not None]
    assert moved and abs(moved[-1].concurrency - 16.0) <= 1.6  # type: ignore[operator]
