"""Special functions, log histograms and the anytime-valid tests of the A/B guard.

scipy (a dev dependency) is the oracle for every hand-written formula here;
the coverage tests check the time-uniform guarantee by simulation.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.streams.experiment import fixed_horizon_p
from tailguard.streams.loghist import (
    RELATIVE_ACCURACY,
    LogHist,
    bucket_index,
    lower_edge,
    upper_edge,
)
from tailguard.streams.sequential import (
    bernoulli_cs,
    bernoulli_log_e,
    p_value_by_bisection,
    quantile_cs,
    quantile_ranks,
    srm_log_bf,
    srm_test,
)
from tailguard.streams.special import chi2_isf, chi2_sf, lgamma, log_beta

scipy_stats = pytest.importorskip("scipy.stats")
scipy_special = pytest.importorskip("scipy.special")


# --- special functions ------------------------------------------------------------


def test_lgamma_matches_scipy_from_tiny_to_huge_arguments() -> None:
    x = np.concatenate([np.linspace(1e-4, 30, 3000), np.logspace(1.5, 9, 500)])
    ours, ref = lgamma(x), scipy_special.gammaln(x)
    assert np.max(np.abs(ours - ref) / np.maximum(1.0, np.abs(ref))) < 1e-12


def test_log_beta_matches_scipy() -> None:
    a = np.array([0.5, 1.0, 3.7, 950.0, 12_345.5])
    b = np.array([0.5, 2.0, 0.2, 50.0, 99_999.0])
    assert np.allclose(log_beta(a, b), scipy_special.betaln(a, b), rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 20])
@pytest.mark.parametrize("x", [1e-3, 0.5, 2.0, 10.83, 40.0, 150.0, 700.0])
def test_chi2_sf_matches_scipy_including_tiny_p_values(df: int, x: float) -> None:
    ref = scipy_stats.chi2.sf(x, df)
    assert chi2_sf(x, df) == pytest.approx(ref, rel=1e-10, abs=1e-300)


def test_chi2_isf_inverts_the_survival_function() -> None:
    assert chi2_isf(0.001, 1) == pytest.approx(scipy_stats.chi2.isf(0.001, 1), rel=1e-9)
    assert chi2_isf(0.05, 3) == pytest.approx(scipy_stats.chi2.isf(0.05, 3), rel=1e-9)


# --- log histograms ---------------------------------------------------------------


@given(st.floats(min_value=1e-2, max_value=1e7))
def test_a_value_lies_within_its_buckets_edges(x: float) -> None:
    i = int(bucket_index([x])[0])
    assert float(lower_edge(i)) < x * (1 + 1e-12) and x <= float(upper_edge(i)) * (1 + 1e-12)


@settings(max_examples=50)
@given(
    st.lists(st.floats(min_value=0.1, max_value=1e5), min_size=1, max_size=300),
    st.lists(st.floats(min_value=0.1, max_value=1e5), max_size=300),
)
def test_merge_is_addition_and_bytes_round_trip(a: list[float], b: list[float]) -> None:
    whole = LogHist()
    whole.add(a + b)
    left, right = LogHist(), LogHist()
    left.add(a)
    right.add(b)
    left.merge(right)
    assert left == whole
    assert LogHist.from_wire(whole.to_wire()) == whole
    q = whole.quantile(0.9)
    exact = float(np.sort(np.array(a + b))[math.ceil(0.9 * len(a + b)) - 1])
    assert q is not None and abs(q - exact) <= 2.1 * RELATIVE_ACCURACY * exact


# --- proportions: beta-binomial mixture -------------------------------------------


def test_bernoulli_log_e_is_the_beta_binomial_over_binomial_ratio() -> None:
    for k, n, p in [(0, 10, 0.3), (37, 1000, 0.05), (9990, 10_000, 0.998), (5, 5, 0.5)]:
        ref = scipy_stats.betabinom.logpmf(k, n, 0.5, 0.5) - scipy_stats.binom.logpmf(k, n, p)
        assert float(bernoulli_log_e(k, n, p, 0.5, 0.5)) == pytest.approx(ref, rel=1e-9, abs=1e-9)


def test_bernoulli_bounds_are_the_roots_of_the_e_value() -> None:
    lo, hi = bernoulli_cs(123, 5000, 0.01)
    for bound in (float(lo), float(hi)):
        assert float(bernoulli_log_e(123, 5000, bound, 0.5, 0.5)) == pytest.approx(
            math.log(100), abs=1e-6
        )
    assert float(lo) < 123 / 5000 < float(hi)


def test_scalar_and_vector_paths_agree() -> None:
    s, n = np.array([0, 3, 500, 9990, 20]), np.array([10, 100, 1000, 10_000, 20])
    lo, hi = bernoulli_cs(s, n, 0.005)
    for i in range(s.size):
        l1, h1 = bernoulli_cs(int(s[i]), int(n[i]), 0.005)
        assert float(l1) == pytest.approx(lo[i], abs=1e-12)
        assert float(h1) == pytest.approx(hi[i], abs=1e-12)
    r_lo, r_hi = quantile_ranks(np.array([300, 5000, 5000]), 0.95, 0.001)
    s_lo, s_hi = quantile_ranks(5000, 0.95, 0.001)
    assert r_lo[1] == pytest.approx(float(s_lo)) and r_hi[2] == pytest.approx(float(s_hi))


def test_proportion_sequence_covers_at_every_look_with_probability_one_minus_alpha() -> None:
    rng = np.random.default_rng(3)
    runs, n, p, alpha = 400, 4000, 0.03, 0.1
    hits = np.cumsum(rng.random((runs, n)) < p, axis=1)
    missed = np.zeros(runs, dtype=bool)
    for t in range(20, n + 1, 20):  # 200 looks
        lo, hi = bernoulli_cs(hits[:, t - 1], np.full(runs, t), alpha)
        missed |= (lo > p) | (hi < p)
    assert missed.mean() <= alpha


# --- quantiles ----------------------------------------------------------------------


def test_quantile_sequence_covers_the_true_p95_at_every_look() -> None:
    rng = np.random.default_rng(4)
    runs, n, alpha, q = 200, 3000, 0.1, 0.95
    truth = math.exp(0.35 * 1.6448536269514722) * 180.0  # lognormal(log 180, 0.35) P95
    missed = np.zeros(runs, dtype=bool)
    hists = [LogHist() for _ in range(runs)]
    draws = rng.lognormal(math.log(180.0), 0.35, (runs, n))
    for t in range(100, n + 1, 100):
        for r in range(runs):
            hists[r].add(draws[r, t - 100 : t])
        lo_i = min(h.lo for h in hists)
        hi_i = max(h.hi for h in hists)
        cum = np.cumsum(np.stack([h.dense(lo_i, hi_i) for h in hists]), axis=1)
        r_lo, r_hi = quantile_ranks(np.full(runs, t), q, alpha)
        lower, upper = quantile_cs(cum, lo_i, r_lo, r_hi)
        missed |= (lower > truth) | (upper < truth)
    assert missed.mean() <= alpha


def test_quantile_bounds_bracket_the_order_statistics() -> None:
    rng = np.random.default_rng(5)
    values = rng.exponential(100.0, 2000)
    h = LogHist()
    h.add(values)
    r_lo, r_hi = quantile_ranks(2000, 0.9, 0.01)
    lower, upper = quantile_cs(np.cumsum(h.counts), h.lo, r_lo, r_hi)
    ordered = np.sort(values)
    assert float(lower) <= ordered[math.floor(float(r_lo))]  # X_(⌊r_lo⌋+1), 0-based
    assert float(upper) >= ordered[math.ceil(float(r_hi)) - 1]  # X_(⌈r_hi⌉)


def test_too_few_values_give_an_unbounded_side() -> None:
    r_lo, r_hi = quantile_ranks(20, 0.95, 0.001)
    assert math.isinf(float(r_hi))
    h = LogHist()
    h.add(np.arange(1.0, 21.0))
    lower, upper = quantile_cs(np.cumsum(h.counts), h.lo, r_lo, r_hi)
    assert math.isinf(float(upper)) and float(lower) >= 0.0


# --- SRM ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("counts", "weights"),
    [((50_550, 49_450), (1, 1)), ((51_000, 49_000), (1, 1)), ((100, 310, 590), (1, 3, 6))],
)
def test_srm_chi_square_and_bayes_factor_match_scipy(
    counts: tuple[int, ...], weights: tuple[float, ...]
) -> None:
    w = np.array(weights, dtype=float) / sum(weights)
    res = srm_test(counts, weights)
    ref = scipy_stats.chisquare(counts, f_exp=np.array(w) * sum(counts))
    assert res.chi2 == pytest.approx(ref.statistic, rel=1e-12)
    assert res.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    x = np.array(counts)
    bf = scipy_stats.dirichlet_multinomial.logpmf(
        x, 1000.0 * w, x.sum()
    ) - scipy_stats.multinomial.logpmf(x, x.sum(), w)
    assert res.log_bf == pytest.approx(bf, rel=1e-9, abs=1e-8)
    assert float(srm_log_bf(x, w)) == pytest.approx(res.log_bf)


def test_a_51_49_split_of_100k_units_is_flagged_and_a_fair_one_is_not() -> None:
    bad = srm_test([49_000, 51_000], [0.5, 0.5])
    assert bad.p_value < 1e-9 and bad.p_value_sequential < 0.001
    fair = srm_test([50_080, 49_920], [0.5, 0.5])
    assert fair.p_value > 0.5 and fair.p_value_sequential == 1.0


def test_sequential_srm_p_value_never_rises() -> None:
    first = srm_test([600, 400], [0.5, 0.5])
    later = srm_test([5100, 4900], [0.5, 0.5], max_log_bf=first.max_log_bf)
    assert later.p_value_sequential == pytest.approx(first.p_value_sequential)


# --- fixed-horizon reference and p-value inversion ---------------------------------


@pytest.mark.parametrize(
    "table", [((30, 970), (12, 988)), ((4990, 10), (4985, 15)), ((400, 600), (350, 650))]
)
def test_fixed_horizon_p_is_scipys_two_by_two_chi_square(
    table: tuple[tuple[int, int], tuple[int, int]],
) -> None:
    ref = scipy_stats.chi2_contingency(np.array(table), correction=False).pvalue
    assert fixed_horizon_p(table) == pytest.approx(ref, rel=1e-9)


def test_p_value_by_bisection_finds_the_threshold_of_a_monotone_test() -> None:
    assert p_value_by_bisection(lambda a: a >= 0.0123) == pytest.approx(0.0123, rel=1e-6)
    assert p_value_by_bisection(lambda a: False) == 1.0
