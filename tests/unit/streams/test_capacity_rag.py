"""The RAG threshold: Beta maximum-likelihood fit checked against scipy; what is published."""

import math
from collections import deque

import numpy as np
import pytest
from scipy import special, stats
from tailguard.streams.rag import (
    RagConfig,
    RagThreshold,
    beta_cdf,
    beta_ppf,
    digamma,
    fit_beta,
    quantile_se,
)


@pytest.mark.parametrize(
    ("a", "b", "seed"), [(8.0, 2.0, 1), (2.0, 5.0, 2), (30.0, 6.0, 3), (0.8, 0.9, 4)]
)
def test_beta_fit_matches_scipy_within_one_percent(a: float, b: float, seed: int) -> None:
    xs = np.random.default_rng(seed).beta(a, b, 100)
    ours = fit_beta(xs.tolist())
    sa, sb, _, _ = stats.beta.fit(xs, floc=0, fscale=1)
    assert ours.alpha == pytest.approx(sa, rel=0.01)
    assert ours.beta == pytest.approx(sb, rel=0.01)


@pytest.mark.parametrize("x", [0.1, 0.5, 1.0, 3.7, 12.0])
def test_digamma_matches_scipy(x: float) -> None:
    assert digamma(x) == pytest.approx(float(special.digamma(x)), abs=1e-10)


@pytest.mark.parametrize(
    ("q", "a", "b"),
    [(0.05, 8.0, 2.0), (0.5, 2.0, 5.0), (0.95, 30.0, 6.0), (0.05, 0.5, 0.5), (0.05, 200.0, 20.0)],
)
def test_quantile_and_cdf_match_scipy(q: float, a: float, b: float) -> None:
    assert beta_ppf(q, a, b) == pytest.approx(float(stats.beta.ppf(q, a, b)), abs=1e-8)
    assert beta_cdf(0.7, a, b) == pytest.approx(float(stats.beta.cdf(0.7, a, b)), abs=1e-10)


def test_drifting_index_moves_the_threshold_down_and_small_moves_are_not_published() -> None:
    rng = np.random.default_rng(7)
    tracker = RagThreshold(RagConfig())
    first = [e for x in rng.beta(18, 3, 100) if (e := tracker.add(float(x))) is not None]
    assert len(first) == 1 and first[0]["previous"] is None
    steady = [e for x in rng.beta(18, 3, 100) if (e := tracker.add(float(x))) is not None]
    assert len(steady) <= 1
    before = tracker.published
    drift = [e for x in rng.beta(8, 5, 200) if (e := tracker.add(float(x))) is not None]
    assert drift and tracker.published is not None and before is not None
    assert tracker.published < before - 0.1
    downs = sum(e["threshold"] < e["previous"] for e in drift)
    assert downs > len(drift) - downs


# ------------------------------------------------- dead band: what gets published


def thresholds(sims: "np.typing.ArrayLike", config: RagConfig | None = None) -> list[float]:
    tracker = RagThreshold(config or RagConfig())
    return [e["threshold"] for x in sims if (e := tracker.add(float(x))) is not None]


def test_the_simulated_drift_publishes_a_few_thresholds_each_lower_than_the_last() -> None:
    # The demo's drifting index (Beta(18, 3) → Beta(8, 5)) with the defaults. With a
    # fixed 0.02 tolerance (≈ 1 standard error) it published 13, raised and lowered
    # in turn; the dead band of 3 standard errors keeps sampling noise out.
    from tailguard.simulator import capacity as cap

    sims = [e["rag_top1_similarity"] for e in cap.index_drift(0)]
    got = thresholds(sims)
    assert 2 <= len(got) <= 5, got
    assert got == sorted(got, reverse=True) and len(set(got)) == len(got)
    assert got[-1] < got[0] - 0.2


def test_a_steady_drift_moves_the_threshold_monotonically() -> None:
    # The mean similarity slides from 0.86 to 0.62 over 1,500 queries: a steady
    # drift. Over 12 seeds the published thresholds go down step by step (the
    # reversal band admits a rare upward step: at most one run of 12).
    reversed_runs = 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        m, k = np.linspace(0.857, 0.615, 1500), np.linspace(21, 13, 1500)
        got = thresholds(rng.beta(m * k, (1 - m) * k))
        assert len(got) >= 3 and got[-1] < got[0] - 0.15
        reversed_runs += got != sorted(got, reverse=True)
    assert reversed_runs <= 1


def test_a_steady_index_publishes_almost_nothing_after_its_first_threshold() -> None:
    changes = [len(thresholds(np.random.default_rng(s).beta(18, 3, 2000))) - 1 for s in range(6)]
    assert sum(changes) <= 6, changes  # a 0.02 tolerance alone: ~15 per run


def test_quantile_standard_error_matches_the_spread_of_refits() -> None:
    rng = np.random.default_rng(0)
    fits = [fit_beta(list(rng.beta(18, 3, 100))) for _ in range(300)]
    spread = float(np.std([beta_ppf(0.05, f.alpha, f.beta) for f in fits]))
    se = quantile_se(0.05, fit_beta(list(rng.beta(18, 3, 100_000)))) * math.sqrt(100_000 / 100)
    assert se == pytest.approx(spread, rel=0.15)


@pytest.mark.parametrize(("direction", "published"), [(-1, False), (+1, True), (0, True)])
def test_a_move_against_the_last_direction_needs_the_wider_band(
    direction: int, published: bool
) -> None:
    # A refit 4.5 standard errors above the published threshold: inside the
    # reversal band (6 se) after a lowering, outside the band (3 se) otherwise.
    values = [float(x) for x in np.random.default_rng(3).beta(18, 3, 100)]
    fit = fit_beta(values)
    t, se = beta_ppf(0.05, fit.alpha, fit.beta), quantile_se(0.05, fit)
    cfg = RagConfig(refit_every=1)
    before = t - 4.5 * se
    tracker = RagThreshold(cfg, deque(values[:-1]), published=before, direction=direction)
    change = tracker.add(values[-1])
    assert (change is not None) is published
    if change is not None:
        assert change["threshold"] == pytest.approx(t, abs=1e-5)
        assert change["band"] == pytest.approx(3 * se, abs=1e-5) and tracker.direction == 1
    else:
        assert tracker.published == before and tracker.direction == direction


def test_an_index_that_returns_one_similarity_gets_it_as_its_threshold() -> None:
    # All values equal: the Beta likelihood grows without bound with α and β
    # (the fit used to divide by a curvature that underflowed to zero).
    tracker = RagThreshold(RagConfig(window=50, min_samples=20))
    changes = [c for c in (tracker.add(0.8) for _ in range(200)) if c is not None]
    assert changes and changes[0]["threshold"] == pytest.approx(0.8, abs=1e-4)
    fit = fit_beta([0.5] * 10)
    assert fit.mean == pytest.approx(0.5) and fit.alpha > 1e6
