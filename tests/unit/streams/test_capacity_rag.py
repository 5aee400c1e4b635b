"""The RAG threshold: Beta maximum-likelihood fit checked against scipy."""

import numpy as np
import pytest
from scipy import special, stats
from tailguard.streams.rag import RagConfig, RagThreshold, beta_cdf, beta_ppf, digamma, fit_beta


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
