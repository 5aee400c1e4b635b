"""Stratified permutation test of a difference in two binary rates (hallucination guardrail).

Data: per stratum ``s`` (a prompt group, else a prompt version) the rated
requests of the treatment and the control arm and how many of them a rater
labelled ``hallucination``::

    stratum s:   treatment  x_ts of n_ts      control  x_cs of n_cs
                 m_s = x_ts + x_cs  (labelled hallucination)   n_s = n_ts + n_cs

Statistic — the Mantel–Haenszel (CMH-weighted) risk difference pooled over
strata (Greenland & Robins 1985, Biometrics 41)::

    D = Σ_s w_s (x_ts/n_ts − x_cs/n_cs) / Σ_s w_s,        w_s = n_ts · n_cs / n_s

A stratum with one arm only has w_s = 0: it says nothing about the arms.

Null hypothesis: within each stratum the arm label is exchangeable with the
outcome (the prompt change makes no difference). A permutation shuffles the
arm labels **within each stratum**, keeping n_ts, n_cs and m_s, so the
treatment's count X_ts is hypergeometric(n_s, m_s, n_ts) and the strata are
independent. Because ``w_s · (x_ts/n_ts − x_cs/n_cs) = x_ts − m_s n_ts / n_s``,

    D · Σ w_s = T − E[T],     T = Σ_s X_ts

so D is an increasing function of the integer T (the CMH statistic's
numerator; Σ w_s is fixed under permutation), and the permutation p-value of
"treatment worse" is ``P(T ≥ t_obs)``. Two ways to compute it:

- **exact** — the distribution of T is the convolution of the strata's
  hypergeometric distributions: every within-stratum permutation, counted
  without listing them (the exact conditional test; one stratum = Fisher's
  one-sided exact test). Cost Σ_s |support so far| · |support_s| ≤ (Σ m_s)²;
- **monte_carlo** — B permutations drawn with a seeded ``numpy`` generator
  (each stratum's X_ts from its hypergeometric law, which *is* a shuffle of the
  labels), ``p = (1 + #{T_b ≥ t_obs}) / (B + 1)`` (Phipson & Smyth 2010, never 0).
  The seed is derived from a caller's key, so a replay draws the same
  permutations and takes the same decision.

``method="auto"`` takes the exact test unless its cost passes
:data:`EXACT_MAX_WORK`.

Strata with one arm only are pooled into one residual stratum first
(:func:`pool_single_arm`): in a prompt experiment whose arms *are* two prompt
versions, stratifying by version would leave no stratum with both arms; the
pooled residual turns that case into the unstratified test instead of a test
without any data.

The interval of D (for "the difference is within the limit") is the Wald
interval with the Greenland–Robins variance of the pooled difference,
``Var D = Σ w_s² (p̃_ts(1−p̃_ts)/n_ts + p̃_cs(1−p̃_cs)/n_cs) / (Σ w_s)²`` with
``p̃ = (x + ½)/(n + 1)`` so a stratum without any hallucination still has a
variance.
"""

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
from tailguard.streams.special import chi2_isf

__all__ = [
    "EXACT_MAX_WORK",
    "RESIDUAL",
    "PermutationResult",
    "Stratum",
    "mh_difference",
    "mh_interval",
    "pool_single_arm",
    "seed_of",
    "stratified_permutation_test",
]

#: Largest convolution work (multiply-adds) the exact method takes under "auto".
EXACT_MAX_WORK = 20_000_000
#: Name of the stratum that pools the strata holding one arm only.
RESIDUAL = "(single-arm strata)"


@dataclass(frozen=True, slots=True)
class Stratum:
    """Counts of one stratum: ``x_*`` hallucinations among ``n_*`` rated requests."""

    x_t: int
    n_t: int
    x_c: int
    n_c: int

    def __post_init__(self) -> None:
        for name in ("x_t", "n_t", "x_c", "n_c"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                msg = f"stratum count {name} must be an integer >= 0, got {v!r}"
                raise ValueError(msg)
        if self.x_t > self.n_t or self.x_c > self.n_c:
            msg = f"more hallucinations than rated requests in a stratum: {self}"
            raise ValueError(msg)

    @property
    def n(self) -> int:
        return self.n_t + self.n_c

    @property
    def m(self) -> int:
        return self.x_t + self.x_c

    @property
    def weight(self) -> float:
        return self.n_t * self.n_c / self.n if self.n else 0.0


@dataclass(frozen=True, slots=True)
class PermutationResult:
    """Outcome of :func:`stratified_permutation_test`."""

    #: Pooled (Mantel–Haenszel) difference treatment − control; None without data.
    difference: float | None
    #: One-sided p-value of "treatment not worse" (upper tail); 1.0 without data.
    p_value: float
    method: Literal["exact", "monte_carlo", "none"]
    #: Permutations drawn (Monte Carlo) or 0 (exact: all of them).
    permutations: int
    #: Strata that took part (after pooling), and how many hold both arms.
    strata: int
    #: Observed and expected (under the null) hallucinations of the treatment.
    t_observed: int
    t_expected: float


def pool_single_arm(strata: Mapping[str, Stratum]) -> dict[str, Stratum]:
    """The strata with both arms as they are, the ones with one arm summed into
    :data:`RESIDUAL` (kept only if the sum then holds both arms)."""
    out: dict[str, Stratum] = {}
    xt = nt = xc = nc = 0
    for key, s in strata.items():
        if s.n_t and s.n_c:
            out[key] = s
        else:
            xt, nt, xc, nc = xt + s.x_t, nt + s.n_t, xc + s.x_c, nc + s.n_c
    if nt and nc:
        out[RESIDUAL] = Stratum(xt, nt, xc, nc)
    return out


def mh_difference(strata: Iterable[Stratum]) -> float | None:
    """The Mantel–Haenszel pooled risk difference (None when no stratum has both arms)."""
    num = den = 0.0
    for s in strata:
        w = s.weight
        if w:
            num += w * (s.x_t / s.n_t - s.x_c / s.n_c)
            den += w
    return num / den if den else None


def mh_interval(strata: Iterable[Stratum], alpha: float) -> tuple[float, float]:
    """Two-sided ``1 − 2α`` Wald interval of the pooled difference (each side α)."""
    num = den = var = 0.0
    for s in strata:
        w = s.weight
        if not w:
            continue
        num += w * (s.x_t / s.n_t - s.x_c / s.n_c)
        den += w
        pt = (s.x_t + 0.5) / (s.n_t + 1)
        pc = (s.x_c + 0.5) / (s.n_c + 1)
        var += w * w * (pt * (1 - pt) / s.n_t + pc * (1 - pc) / s.n_c)
    if not den:
        return -1.0, 1.0
    d = num / den
    z = math.sqrt(chi2_isf(min(1.0, 2.0 * alpha), 1))  # the one-sided normal quantile
    half = z * math.sqrt(var) / den
    return max(-1.0, d - half), min(1.0, d + half)


def _hypergeom(s: Stratum) -> tuple[int, np.ndarray]:
    """(lowest k, pmf over k..) of X_ts ~ hypergeometric(n_s, m_s, n_ts)."""
    n, m, nt = s.n, s.m, s.n_t
    lo, hi = max(0, nt - (n - m)), min(nt, m)
    k = np.arange(lo, hi + 1, dtype=np.float64)
    lg = math.lgamma
    log_total = lg(n + 1) - lg(nt + 1) - lg(n - nt + 1)
    from_m = np.array([lg(m + 1) - lg(x + 1) - lg(m - x + 1) for x in k.tolist()])
    rest = np.array([lg(n - m + 1) - lg(nt - x + 1) - lg(n - m - nt + x + 1) for x in k.tolist()])
    pmf = np.exp(from_m + rest - log_total)
    return lo, pmf / pmf.sum()


def _exact_work(strata: Iterable[Stratum]) -> int:
    work, size = 0, 1
    for s in strata:
        k = min(s.n_t, s.m) - max(0, s.n_t - (s.n - s.m)) + 1
        work += size * k
        size += k - 1
    return work


def seed_of(*parts: object) -> int:
    """A 64-bit seed from a key (experiment, arm, look …): the same on every replay."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def stratified_permutation_test(
    strata: Mapping[str, Stratum],
    *,
    method: Literal["auto", "exact", "monte_carlo"] = "auto",
    permutations: int = 20_000,
    seed: int = 0,
    pool: bool = True,
) -> PermutationResult:
    """One-sided stratified permutation test of "the treatment's rate is higher".

    ``pool``: first pool single-arm strata (:func:`pool_single_arm`).
    """
    used = pool_single_arm(strata) if pool else {k: s for k, s in strata.items() if s.weight}
    cells = [s for s in used.values() if s.weight]
    if not cells:
        return PermutationResult(None, 1.0, "none", 0, 0, 0, 0.0)
    t_obs = sum(s.x_t for s in cells)
    t_exp = sum(s.m * s.n_t / s.n for s in cells)
    diff = mh_difference(cells)
    if method == "auto":
        method = "exact" if _exact_work(cells) <= EXACT_MAX_WORK else "monte_carlo"
    if method == "exact":
        lo, dist = 0, np.ones(1)
        for s in cells:
            k0, pmf = _hypergeom(s)
            dist = np.convolve(dist, pmf)
            lo += k0
        idx = t_obs - lo
        p = float(dist[idx:].sum()) if idx > 0 else 1.0
        return PermutationResult(diff, min(1.0, max(0.0, p)), "exact", 0, len(cells), t_obs, t_exp)
    if permutations < 1:
        msg = f"permutations must be >= 1, got {permutations}"
        raise ValueError(msg)
    rng = np.random.default_rng(seed)
    total = np.zeros(permutations, dtype=np.int64)
    for s in cells:
        total += rng.hypergeometric(s.m, s.n - s.m, s.n_t, size=permutations)
    hits = int((total >= t_obs).sum())
    p = (1 + hits) / (permutations + 1)
    return PermutationResult(diff, p, "monte_carlo", permutations, len(cells), t_obs, t_exp)
