"""Special functions the sequential tests need, vectorised over numpy arrays.

numpy has no log-gamma and tailguard's runtime does not depend on scipy (it is
a dev dependency: the tests use it as the oracle for everything here), so the
few functions the A/B guard needs live here:

- :func:`lgamma` — ``log Γ(x)`` for ``x > 0``: Stirling's series with six
  terms for ``x ≥ 8`` and the recurrence ``Γ(x) = Γ(x + 8) / (x (x+1) … (x+7))``
  below; absolute error < 1e-12 for ``x ≤ 1e4``, relative error < 1e-15
  beyond (checked against ``scipy.special.gammaln``).
- :func:`log_beta` — ``log B(a, b) = lgamma(a) + lgamma(b) − lgamma(a + b)``.
- :func:`chi2_sf` — the chi-square survival function
  ``P(χ²_df ≥ x) = Q(df/2, x/2)``, the regularised upper incomplete gamma
  function, by its power series when ``x < a + 1`` and by Lentz's continued
  fraction otherwise (Press et al., *Numerical Recipes*, 3rd ed., §6.2), so
  tiny p-values keep their relative accuracy.
- :func:`chi2_isf` — its inverse by bisection (critical values).
"""

import math

import numpy as np

__all__ = ["chi2_isf", "chi2_sf", "lgamma", "log_beta"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_SHIFT = 8


def lgamma(x: np.ndarray | float) -> np.ndarray:
    """``log Γ(x)`` elementwise for ``x > 0`` (float64 array, same shape)."""
    x = np.asarray(x, dtype=np.float64)
    small = x < _SHIFT
    z = np.where(small, x + _SHIFT, x)
    zi = 1.0 / z
    zi2 = zi * zi
    series = zi * (
        1.0 / 12.0
        + zi2 * (-1.0 / 360.0 + zi2 * (1.0 / 1260.0 + zi2 * (-1.0 / 1680.0 + zi2 * (1.0 / 1188.0))))
    )
    out = (z - 0.5) * np.log(z) - z + _HALF_LOG_2PI + series
    if np.any(small):
        xs = np.where(small, x, 1.0)
        prod = np.ones_like(xs)
        for k in range(_SHIFT):
            prod = prod * (xs + k)
        out = np.where(small, out - np.log(prod), out)
    return out


def log_beta(a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray:
    """``log B(a, b)`` elementwise for ``a, b > 0``."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return lgamma(a) + lgamma(b) - lgamma(a + b)


def _gamma_q(a: float, x: float) -> float:
    """Regularised upper incomplete gamma ``Q(a, x)`` (Numerical Recipes §6.2)."""
    if x <= 0.0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1.0:
        # P(a, x) = e^{-x} x^a / Γ(a+1) · Σ x^n / ((a+1)…(a+n))
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    # Q(a, x) = e^{-x} x^a / Γ(a) · 1/(x+1-a- 1·(1-a)/(x+3-a- …)) (modified Lentz)
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        if abs(d) < tiny:
            d = tiny
        c = b + an / c
        if abs(c) < tiny:
            c = tiny
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return math.exp(log_front) * h


def chi2_sf(x: float, df: int) -> float:
    """``P(χ²_df ≥ x)``: the p-value of a chi-square statistic ``x`` with ``df`` degrees."""
    if df < 1:
        msg = f"chi-square degrees of freedom must be >= 1, got {df}"
        raise ValueError(msg)
    if not x > 0.0:
        return 1.0
    if df == 1:
        return math.erfc(math.sqrt(x / 2.0))
    if df == 2:
        return math.exp(-x / 2.0)
    return _gamma_q(df / 2.0, x / 2.0)


def chi2_isf(p: float, df: int) -> float:
    """The ``x`` with ``chi2_sf(x, df) = p`` (the critical value at level ``p``)."""
    if not 0.0 < p < 1.0:
        msg = f"level must be in (0, 1), got {p}"
        raise ValueError(msg)
    lo, hi = 0.0, max(1.0, float(df))
    while chi2_sf(hi, df) > p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if chi2_sf(mid, df) > p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)
