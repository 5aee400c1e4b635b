"""Anytime-valid tests for the A/B guard: confidence sequences and a sequential SRM test.

The guard looks at every experiment at every update. A fixed-horizon test
(a t-test, a chi-square test at p < 0.001) checked that often rejects a true
null far more often than its level says: the chance that *some* look
crosses grows with the number of looks. Everything here is instead built
from **nonnegative martingales** under the null, so by Ville's inequality
(``P(∃t: M_t ≥ 1/α) ≤ α``) the error guarantee holds uniformly over time:
the guard may look after every event, stop whenever it likes, and the
chance of ever wrongly rejecting stays ≤ α.

Proportions — beta-binomial mixture confidence sequence
-------------------------------------------------------
For ``s`` successes in ``t`` Bernoulli(p) trials, the mixture of likelihood
ratios over a Beta(a, b) prior (Robbins 1970, "Statistical methods related to
the law of the iterated logarithm", Ann. Math. Statist. 41; Howard, Ramdas,
McAuliffe & Sekhon 2021, "Time-uniform, nonparametric, nonasymptotic
confidence sequences", Ann. Statist. 49, §3: the conjugate "beta-binomial"
mixture)::

    M_t(p) = ∫ q^s (1−q)^(t−s) dBeta(q; a, b) / (p^s (1−p)^(t−s))
           = B(a + s, b + t − s) / (B(a, b) · p^s (1−p)^(t−s))

is a martingale with ``M_0 = 1`` under p, so ``CS_t = {p : M_t(p) < 1/α}`` covers
the true p at *every* t with probability ≥ 1 − α. ``log M_t(p)`` is convex in p
with its minimum (≤ 0) at ŝ/t, so the set is an interval found by bisection
(:func:`bernoulli_cs`). It depends on the counts only, not their order.

Quantiles — rank confidence sequence (Howard & Ramdas 2022)
-----------------------------------------------------------
Howard & Ramdas, "Sequential estimation of quantiles with applications to
A/B-testing and best-arm identification", Bernoulli 28(3), 2022: for the
quantile ``Q`` at level ``q`` of a continuous distribution, ``N_t = #{X_i ≤ Q}`` is
Binomial(t, q), so the same mixture — here centred on q, Beta(c·q, c·(1−q)) —
bounds it for all t at once: ``r_lo(t) < N_t < r_hi(t)`` where ``r_lo, r_hi`` are
the roots of ``log M_t(k) = log(1/α)`` around ``q·t`` (:func:`quantile_ranks`).
Translated to order statistics (their Theorem 1 construction)::

    Q ≥ X_(⌊r_lo⌋+1)          Q ≤ X_(⌈r_hi⌉)

With values kept in log buckets (:mod:`tailguard.streams.loghist`) the
bounds are read off bucket edges, which only widens them (lower edge of the
bucket holding the lower order statistic, upper edge of the upper one):
:func:`quantile_cs`.

Two arms are compared through their own sequences: with arm-level
coverage 1 − α/2 each, ``[L_T / U_C, U_T / L_C]`` covers the ratio of the
quantiles (and ``[L_T − U_C, U_T − L_C]`` their difference) at every t with
probability ≥ 1 − α (union bound). Howard & Ramdas §5 build their A/B test
the same way. The always-valid p-value of a hypothesis is the smallest α at
which its interval excludes it (:func:`p_value_by_bisection`).

Sample ratio mismatch — Dirichlet-multinomial sequential test
-------------------------------------------------------------
Lindon & Malek, "Anytime-valid inference for multinomial count data",
NeurIPS 2022: against the planned assignment probabilities ``w`` the Bayes
factor of a Dirichlet(C·w) mixture over the multinomial alternative::

    BF_n = Γ(C) / Γ(C + n) · Π_i Γ(C w_i + x_i) / Γ(C w_i) / Π_i w_i^(x_i)

is a martingale under H0, so ``p_n = min(1, 1 / max_{m ≤ n} BF_m)`` is an
anytime-valid p-value. :func:`srm_test` reports it beside the classical
Pearson chi-square goodness-of-fit statistic and its fixed-horizon p-value.

Assumptions, stated: observations within an arm are independent draws
(requests of one arm are treated as i.i.d.; a unit that sends many correlated
requests makes the sequences too narrow — the clustered case, e.g. the delta
method for percentile metrics of Deng, Knoblich & Lu, KDD 2018, is not
covered here); quantile sequences assume a continuous distribution.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tailguard.streams.loghist import lower_edge, upper_edge
from tailguard.streams.special import chi2_sf, lgamma, log_beta

__all__ = [
    "DEFAULT_BERNOULLI_PRIOR",
    "DEFAULT_QUANTILE_PRIOR_N",
    "DEFAULT_SRM_PRIOR_N",
    "SrmResult",
    "bernoulli_cs",
    "bernoulli_log_e",
    "chi_square_gof",
    "p_value_by_bisection",
    "quantile_cs",
    "quantile_ranks",
    "srm_log_bf",
    "srm_test",
]

#: Beta(½, ½) (Jeffreys) prior of the proportion mixture.
DEFAULT_BERNOULLI_PRIOR = (0.5, 0.5)
#: Concentration c of the Beta(c·q, c·(1−q)) prior of the quantile mixture: the
#: sequences are tightest around a few thousand observations (the A/B harness,
#: ``bench/ab_guard.py``, picked it).
DEFAULT_QUANTILE_PRIOR_N = 1000.0
#: Concentration C of the Dirichlet(C·w) prior of the SRM test: tuned to
#: imbalances of about one point at 10^4–10^5 units.
DEFAULT_SRM_PRIOR_N = 1000.0

_BISECT = 48
#: A monotone test: ``alpha -> rejects?`` (or ``x -> past the root?`` when bisecting).
RejectAt = Callable[[float], bool]


def _log_e_scalar(k: float, t: float, p: float, a: float, b: float) -> float:
    """Scalar :func:`bernoulli_log_e` (math.lgamma: ~50x faster than numpy on one value)."""
    lg = math.lgamma
    lik = (k * math.log(p) if k > 0 else 0.0) + ((t - k) * math.log1p(-p) if t - k > 0 else 0.0)
    return lg(a + k) + lg(b + t - k) - lg(a + b + t) - (lg(a) + lg(b) - lg(a + b)) - lik


def _bisect_scalar(f: RejectAt, inside: float, outside: float) -> float:
    """The point between ``inside`` (f false) and ``outside`` (f true) where f turns true."""
    for _ in range(_BISECT):
        mid = 0.5 * (inside + outside)
        if f(mid):
            outside = mid
        else:
            inside = mid
    return 0.5 * (inside + outside)


def bernoulli_log_e(
    k: np.ndarray | float, t: np.ndarray | float, p: np.ndarray | float, a: float, b: float
) -> np.ndarray:
    """``log M_t(p)`` of the beta-binomial mixture for ``k`` successes in ``t`` trials."""
    k = np.asarray(k, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        lik = np.where(k > 0, k * np.log(p), 0.0) + np.where(t - k > 0, (t - k) * np.log1p(-p), 0.0)
    return log_beta(a + k, b + t - k) - log_beta(a, b) - lik


def bernoulli_cs(
    successes: np.ndarray | float,
    trials: np.ndarray | float,
    alpha: float,
    prior: tuple[float, float] = DEFAULT_BERNOULLI_PRIOR,
) -> tuple[np.ndarray, np.ndarray]:
    """Anytime-valid ``(lower, upper)`` bounds of a proportion (elementwise).

    With ``trials == 0`` the interval is ``[0, 1]``.
    """
    a, b = prior
    level = math.log(1.0 / alpha)
    if np.ndim(successes) == 0 and np.ndim(trials) == 0:
        lo_, hi_ = _bernoulli_cs_scalar(float(successes), float(trials), level, a, b)
        return np.asarray(lo_), np.asarray(hi_)
    s = np.asarray(successes, dtype=np.float64)
    t = np.asarray(trials, dtype=np.float64)
    s, t = np.broadcast_arrays(s, t)
    phat = np.where(t > 0, s / np.maximum(t, 1.0), 0.5)
    # log M_t(p) = const − lik(p): the mixture term does not depend on p
    const = log_beta(a + s, b + t - s) - log_beta(a, b)

    def over(p: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            lik = np.where(s > 0, s * np.log(p), 0.0) + np.where(
                t - s > 0, (t - s) * np.log1p(-p), 0.0
            )
        return np.asarray(const - lik >= level)

    def solve(inside: np.ndarray, outside: np.ndarray) -> np.ndarray:
        for _ in range(_BISECT):
            mid = 0.5 * (inside + outside)
            hit = over(mid)
            inside, outside = np.where(hit, inside, mid), np.where(hit, mid, outside)
        return 0.5 * (inside + outside)

    lower = solve(phat.copy(), np.zeros_like(phat))
    upper = solve(phat.copy(), np.ones_like(phat))
    lower = np.where((s <= 0) | ~over(np.full_like(phat, 1e-300)), 0.0, lower)
    upper = np.where((s >= t) | ~over(np.full_like(phat, 1.0 - 1e-16)), 1.0, upper)
    empty = t <= 0
    return np.where(empty, 0.0, lower), np.where(empty, 1.0, upper)


def _bernoulli_cs_scalar(
    s: float, t: float, level: float, a: float, b: float
) -> tuple[float, float]:
    if t <= 0:
        return 0.0, 1.0
    phat = s / t

    def over(p: float) -> bool:
        return _log_e_scalar(s, t, p, a, b) >= level

    lower = 0.0 if s <= 0 or not over(1e-300) else _bisect_scalar(over, phat, 0.0)
    upper = 1.0 if s >= t or not over(1.0 - 1e-16) else _bisect_scalar(over, phat, 1.0)
    return lower, upper


def quantile_ranks(
    trials: np.ndarray | float,
    q: float,
    alpha: float,
    prior_n: float = DEFAULT_QUANTILE_PRIOR_N,
) -> tuple[np.ndarray, np.ndarray]:
    """Rank bounds ``(r_lo, r_hi)``: with probability ≥ 1 − α, for every t,
    ``r_lo(t) < #{X_i ≤ Q(q)} < r_hi(t)``.

    ``r_lo`` is ``-inf`` (``r_hi`` ``+inf``) while no count that low (high) would
    be rejected yet.
    """
    a, b = prior_n * q, prior_n * (1.0 - q)
    level = math.log(1.0 / alpha)
    if np.ndim(trials) == 0:
        n = float(trials)

        def over(k: float) -> bool:
            return _log_e_scalar(k, n, q, a, b) >= level

        lo_ = _bisect_scalar(over, q * n, 0.0) if over(0.0) else -math.inf
        hi_ = _bisect_scalar(over, q * n, n) if over(n) else math.inf
        return np.asarray(lo_), np.asarray(hi_)
    trials_arr = np.asarray(trials, dtype=np.float64)
    t, inverse = np.unique(trials_arr, return_inverse=True)
    shape = trials_arr.shape
    if t.size <= 64:  # few distinct sizes: the scalar path is faster than numpy on tiny arrays
        pairs = [quantile_ranks(float(n), q, alpha, prior_n) for n in t.tolist()]
        lo_u = np.array([float(p[0]) for p in pairs])
        hi_u = np.array([float(p[1]) for p in pairs])
        return lo_u[inverse].reshape(shape), hi_u[inverse].reshape(shape)
    centre = q * t

    def log_e(k: np.ndarray) -> np.ndarray:
        return bernoulli_log_e(k, t, q, a, b)

    def solve(inside: np.ndarray, outside: np.ndarray) -> np.ndarray:
        for _ in range(_BISECT):
            mid = 0.5 * (inside + outside)
            over = log_e(mid) >= level
            inside, outside = np.where(over, inside, mid), np.where(over, mid, outside)
        return 0.5 * (inside + outside)

    zeros = np.zeros_like(t)
    r_lo = solve(centre.copy(), zeros)
    r_hi = solve(centre.copy(), t.copy())
    r_lo = np.where(log_e(zeros) >= level, r_lo, -np.inf)
    r_hi = np.where(log_e(t) >= level, r_hi, np.inf)
    return r_lo[inverse].reshape(shape), r_hi[inverse].reshape(shape)


def quantile_cs(
    cum: np.ndarray, lo_index: int, r_lo: np.ndarray | float, r_hi: np.ndarray | float
) -> tuple[np.ndarray, np.ndarray]:
    """Conservative ``(lower, upper)`` bounds of a quantile from cumulative bucket counts.

    ``cum[..., j]`` is the number of values in buckets ``lo_index … lo_index + j``
    (one row per independent histogram). Lower: the lower edge of the first
    bucket whose cumulative count exceeds ``r_lo``; upper: the upper edge of
    the first bucket whose cumulative count reaches ``r_hi`` (+inf if none).
    """
    cum = np.asarray(cum)
    r_lo = np.asarray(r_lo, dtype=np.float64)
    r_hi = np.asarray(r_hi, dtype=np.float64)
    if cum.shape[-1] == 0:
        shape = np.broadcast_shapes(cum.shape[:-1], r_lo.shape)
        return np.zeros(shape), np.full(shape, np.inf)
    above_lo = cum > r_lo[..., None]
    j_lo = np.argmax(above_lo, axis=-1)
    lower = np.where(np.isfinite(r_lo) & above_lo.any(axis=-1), lower_edge(lo_index + j_lo), 0.0)
    lower = np.where(np.isfinite(r_lo), lower, 0.0)
    reach_hi = cum >= r_hi[..., None]
    j_hi = np.argmax(reach_hi, axis=-1)
    upper = np.where(reach_hi.any(axis=-1), upper_edge(lo_index + j_hi), np.inf)
    return lower, upper


def p_value_by_bisection(rejects: RejectAt, *, floor: float = 1e-12) -> float:
    """The smallest α at which ``rejects(α)`` is true (1.0 if not even at α = 1).

    ``rejects`` must be monotone: rejecting at α implies rejecting at any α' > α
    (true of every interval-exclusion test built from the sequences above).
    """
    if not rejects(1.0):
        return 1.0
    if rejects(floor):
        return floor
    lo, hi = math.log(floor), 0.0  # log α: rejects at hi, not at lo
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        if rejects(math.exp(mid)):
            hi = mid
        else:
            lo = mid
    return math.exp(hi)


# ---------------------------------------------------------------- SRM


def chi_square_gof(counts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Pearson's ``Σ (x_i − n w_i)² / (n w_i)`` over the last axis."""
    x = np.asarray(counts, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    n = x.sum(axis=-1, keepdims=True)
    expected = n * w
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(expected > 0, (x - expected) ** 2 / expected, 0.0)
    return np.asarray(terms.sum(axis=-1))


def srm_log_bf(
    counts: np.ndarray, weights: np.ndarray, prior_n: float = DEFAULT_SRM_PRIOR_N
) -> np.ndarray:
    """``log BF_n`` of the Dirichlet-multinomial test (Lindon & Malek 2022), last axis."""
    x = np.asarray(counts, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    alpha = prior_n * w
    n = x.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lik = np.where(x > 0, x * np.log(w), 0.0).sum(axis=-1)
    return (
        lgamma(prior_n)
        - lgamma(prior_n + n)
        + (lgamma(alpha + x) - lgamma(alpha)).sum(axis=-1)
        - lik
    )


@dataclass(frozen=True, slots=True)
class SrmResult:
    """One SRM evaluation.

    ``p_value``: Pearson chi-square, fixed horizon (what ``scipy.stats.chisquare``
    gives); ``p_value_sequential``: anytime-valid, ``1 / max BF`` so far.
    """

    counts: tuple[int, ...]
    expected: tuple[float, ...]
    chi2: float
    df: int
    p_value: float
    log_bf: float
    max_log_bf: float
    p_value_sequential: float


def srm_test(
    counts: tuple[int, ...] | list[int],
    weights: tuple[float, ...] | list[float],
    *,
    max_log_bf: float = 0.0,
    prior_n: float = DEFAULT_SRM_PRIOR_N,
) -> SrmResult:
    """Chi-square goodness of fit and the sequential Bayes factor of ``counts``
    against planned ``weights`` (normalised here). ``max_log_bf``: the largest
    log BF seen at earlier evaluations (0 at the start)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    x = np.asarray(counts, dtype=np.float64)
    n = float(x.sum())
    chi2 = float(chi_square_gof(x, w))
    df = max(1, len(w) - 1)
    p = chi2_sf(chi2, df) if n > 0 else 1.0
    log_bf = float(srm_log_bf(x, w, prior_n)) if n > 0 else 0.0
    best = max(max_log_bf, log_bf)
    return SrmResult(
        counts=tuple(int(c) for c in counts),
        expected=tuple(float(n * wi) for wi in w),
        chi2=chi2,
        df=df,
        p_value=p,
        log_bf=log_bf,
        max_log_bf=best,
        p_value_sequential=min(1.0, math.exp(-best)),
    )
