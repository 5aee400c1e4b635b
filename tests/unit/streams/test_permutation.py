"""The stratified permutation test against reference computations."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats
from tailguard.streams.permutation import (
    RESIDUAL,
    Stratum,
    mh_difference,
    mh_interval,
    pool_single_arm,
    stratified_permutation_test,
)


def brute_force_p(strata: dict[str, Stratum]) -> float:
    """Every within-stratum relabelling listed, the MH difference computed for each."""
    per_stratum = []
    for s in strata.values():
        outcomes = [1] * s.m + [0] * (s.n - s.m)
        # every choice of which n_t of the n requests are labelled "treatment"
        per_stratum.append(
            [
                (sum(outcomes[i] for i in chosen), s)
                for chosen in itertools.combinations(range(s.n), s.n_t)
            ]
        )
    observed = mh_difference(strata.values())
    assert observed is not None
    hits = total = 0
    for combo in itertools.product(*per_stratum):
        relabelled = [Stratum(x_t, s.n_t, s.m - x_t, s.n_c) for x_t, s in combo]
        d = mh_difference(relabelled)
        assert d is not None
        total += 1
        hits += d >= observed - 1e-12
    return hits / total


TINY = {
    "a": Stratum(3, 5, 1, 4),
    "b": Stratum(1, 3, 0, 4),
    "c": Stratum(2, 4, 2, 3),
}


def test_exact_p_value_equals_listing_every_within_stratum_permutation() -> None:
    res = stratified_permutation_test(TINY, method="exact", pool=False)
    assert res.method == "exact"
    assert res.p_value == pytest.approx(brute_force_p(TINY), abs=1e-12)
    # and a treatment that is better than the control gets a large p-value
    flipped = {k: Stratum(s.x_c, s.n_c, s.x_t, s.n_t) for k, s in TINY.items()}
    better = stratified_permutation_test(flipped, method="exact", pool=False)
    assert better.p_value == pytest.approx(brute_force_p(flipped), abs=1e-12)
    assert better.p_value > res.p_value


@pytest.mark.parametrize(
    ("xt", "nt", "xc", "nc"), [(8, 100, 3, 100), (0, 40, 0, 60), (9, 30, 2, 31)]
)
def test_one_stratum_is_fishers_one_sided_exact_test(xt: int, nt: int, xc: int, nc: int) -> None:
    res = stratified_permutation_test({"v1": Stratum(xt, nt, xc, nc)}, method="exact")
    ref = stats.fisher_exact([[xt, nt - xt], [xc, nc - xc]], alternative="greater")
    assert res.p_value == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-12)


def test_monte_carlo_agrees_with_exact_and_is_deterministic_per_seed() -> None:
    strata = {
        "g1": Stratum(14, 300, 6, 280),
        "g2": Stratum(9, 150, 5, 170),
        "g3": Stratum(3, 60, 1, 55),
    }
    exact = stratified_permutation_test(strata, method="exact")
    mc = stratified_permutation_test(strata, method="monte_carlo", permutations=40_000, seed=7)
    assert mc.method == "monte_carlo" and mc.permutations == 40_000
    se = math.sqrt(exact.p_value * (1 - exact.p_value) / 40_000)
    assert abs(mc.p_value - exact.p_value) < 5 * se + 1e-4
    again = stratified_permutation_test(strata, method="monte_carlo", permutations=40_000, seed=7)
    assert again.p_value == mc.p_value
    other = stratified_permutation_test(strata, method="monte_carlo", permutations=40_000, seed=8)
    assert other.p_value != mc.p_value


def cmh_one_sided(strata: dict[str, Stratum]) -> float:
    """Cochran–Mantel–Haenszel statistic without continuity correction, one-sided."""
    num = var = 0.0
    for s in strata.values():
        num += s.x_t - s.m * s.n_t / s.n
        var += s.n_t * s.n_c * s.m * (s.n - s.m) / (s.n**2 * (s.n - 1))
    return float(stats.norm.sf(num / math.sqrt(var)))


def test_large_strata_agree_with_the_cochran_mantel_haenszel_approximation() -> None:
    rng = np.random.default_rng(3)
    strata = {}
    for i, (pc, nt, nc) in enumerate([(0.02, 900, 1100), (0.05, 1500, 1400), (0.10, 700, 800)]):
        xt = int(rng.binomial(nt, pc + 0.012))
        xc = int(rng.binomial(nc, pc))
        strata[f"g{i}"] = Stratum(xt, nt, xc, nc)
    exact = stratified_permutation_test(strata, method="exact")
    ref = cmh_one_sided(strata)
    # the exact conditional tail is ~½ a point mass above the continuous approximation
    assert 0.005 < ref < 0.5
    assert exact.p_value == pytest.approx(ref, rel=0.2)


def test_single_arm_strata_are_pooled_so_a_version_split_still_compares_the_arms() -> None:
    # a prompt experiment stratified by version: every stratum holds one arm
    strata = {"v1": Stratum(0, 0, 30, 1000), "v2": Stratum(80, 1000, 0, 0)}
    pooled = pool_single_arm(strata)
    assert list(pooled) == [RESIDUAL] and pooled[RESIDUAL] == Stratum(80, 1000, 30, 1000)
    res = stratified_permutation_test(strata)
    assert res.strata == 1 and res.difference == pytest.approx(0.05)
    assert res.p_value < 1e-5
    assert stratified_permutation_test(strata, pool=False).method == "none"


def test_mh_difference_weights_strata_by_their_harmonic_size() -> None:
    strata = [Stratum(10, 100, 5, 100), Stratum(2, 10, 1, 1000)]
    w = [100 * 100 / 200, 10 * 1000 / 1010]
    d = [0.05, 0.2 - 0.001]
    assert mh_difference(strata) == pytest.approx(
        sum(a * b for a, b in zip(w, d, strict=True)) / sum(w)
    )
    lo, hi = mh_interval(strata, 0.025)
    assert lo < mh_difference(strata) < hi  # type: ignore[operator]


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="more hallucinations"):
        Stratum(5, 4, 0, 1)
