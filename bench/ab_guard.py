"""Statistical harness of the A/B guard → ``bench/results/ab_guard.json`` (``make bench-ab``).

What it measures, with the guard's own statistics (:mod:`tailguard.streams.sequential`,
vectorised over runs, the same functions the experiment agent calls):

- **A/A false rollbacks** — ``runs`` experiments whose two arms draw from the
  same distribution, monitored at every update (a batch of ``step`` requests
  per arm) up to ``max_per_arm`` requests per arm, with the default guardrail
  family (TTFT P95, ITL P99 and E2E P95 at most +10 %, success ≥ 99.2 %,
  interruption rate at most +2 points, session completion at most −2
  points). A run counts as a false rollback if *any* guardrail is ever
  breached.
- **Regression detection** — the same with the treatment's TTFT 20 % higher
  (every TTFT × 1.2, hence its P95 +20 %): the share of runs rolled back
  within ``max_per_arm`` requests per arm and the median number of requests
  per arm that took.
- **SRM** — ``srm_runs`` experiments of ``srm_units`` units planned 50/50,
  checked every ``srm_step`` units: assigned with probability 0.51 (a realised
  split of about 51/49) and with a fair coin. Flagged as the guard flags:
  chi-square p < 0.001 *and* sequential p < 0.001 at the same look. For
  comparison, the rate a chi-square test alone would flag under the same
  continuous monitoring, and at the fixed horizon only.
- **p-values vs scipy** — when scipy is installed (a dev dependency): the
  guard's fixed-horizon chi-square p-values and its beta-binomial and
  Dirichlet-multinomial log e-values against scipy's on fixed cases.

Latency values are drawn from the traffic simulator's own model (default
fleet, ``tailguard.simulator``), so their shape is the simulator's; draws are
i.i.d. within an arm. Interactions: one session per 4 requests, IR 5 %, SC 80 %.

Run: ``python -m bench.ab_guard [--runs 500] [--quick]``.
"""

import argparse
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from tailguard.streams.experiment_def import DEFAULT_GUARDRAILS, ExperimentDef, Guardrail
from tailguard.streams.loghist import bucket_index
from tailguard.streams.sequential import (
    bernoulli_cs,
    chi_square_gof,
    quantile_cs,
    quantile_ranks,
    srm_log_bf,
)
from tailguard.streams.special import chi2_isf

from bench.common import machine, run, write_result

LATENCY = {"ttft": 0, "itl": 1, "e2e": 2}
SESSION_EVERY = 4
IR, SC = 0.05, 0.80


@dataclass(frozen=True, slots=True)
class Pool:
    """Per-request values from the simulator: ok flag, TTFT, one gap, E2E."""

    ok: np.ndarray
    values: np.ndarray  # (3, n): ttft, sampled gap, e2e (NaN where absent)


def simulator_pool(n_seconds: float, seed: int) -> Pool:
    from tailguard.simulator.config import SimConfig
    from tailguard.simulator.model import generate

    cfg = SimConfig(
        rate=200, duration_s=n_seconds, seed=seed, experiment=None, start_ms=1_700_000_000_000
    )
    rng = np.random.default_rng(seed)
    ok, ttft, gap, e2e = [], [], [], []
    for ev in generate(cfg):
        good = ev["status"] == "ok"
        ok.append(good)
        ttft.append(ev.get("ttft_ms", math.nan) if good else math.nan)
        gaps = ev.get("itl_ms") or []
        gap.append(gaps[int(rng.integers(len(gaps)))] if good and gaps else math.nan)
        e2e.append(ev["e2e_ms"] if good else math.nan)
    return Pool(np.array(ok), np.array([ttft, gap, e2e], dtype=np.float64))


def _guard_def() -> ExperimentDef:
    return ExperimentDef.from_mapping(
        {"id": "harness", "arms": ["control", "treatment"], "min_samples": {"requests": 1000}}
    )


class Arms:
    """Cumulative state of ``runs`` experiments × 2 arms, updated one step at a time."""

    def __init__(self, runs: int, lo: int, hi: int) -> None:
        self.lo, self.width = lo, hi - lo
        shape = (2, 3, runs, self.width)  # arm, latency metric, run, bucket
        self.hist = np.zeros(shape, dtype=np.int64)
        self.ok = np.zeros((2, runs), dtype=np.int64)
        self.requests = np.zeros((2, runs), dtype=np.int64)
        self.sessions = np.zeros((2, runs), dtype=np.int64)
        self.interrupted = np.zeros((2, runs), dtype=np.int64)
        self.completed = np.zeros((2, runs), dtype=np.int64)

    def add(self, arm: int, ok: np.ndarray, values: np.ndarray, rng: np.random.Generator) -> None:
        """``ok``: (runs, step) bool; ``values``: (3, runs, step)."""
        runs, step = ok.shape
        self.requests[arm] += step
        self.ok[arm] += ok.sum(axis=1)
        for m in range(3):
            v = values[m]
            good = ok & ~np.isnan(v)
            idx = np.clip(bucket_index(np.where(good, v, 1.0)) - self.lo, 0, self.width - 1)
            flat = (np.arange(runs)[:, None] * self.width + idx)[good]
            self.hist[arm, m].reshape(-1)[:] += np.bincount(flat, minlength=runs * self.width)
        s = step // SESSION_EVERY
        self.sessions[arm] += s
        self.interrupted[arm] += rng.binomial(s, IR, runs)
        self.completed[arm] += rng.binomial(s, SC, runs)


def _quantile_bounds(
    arms: Arms, arm: int, metric: int, q: float, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    hist = arms.hist[arm, metric]
    cum = np.cumsum(hist, axis=1)
    n = cum[:, -1]
    r_lo, r_hi = quantile_ranks(n, q, alpha)
    return quantile_cs(cum, arms.lo, r_lo, r_hi)


def _proportion(arms: Arms, arm: int, metric: str) -> tuple[np.ndarray, np.ndarray]:
    if metric == "success_rate":
        return arms.ok[arm], arms.requests[arm]
    if metric == "interruption_rate":
        return arms.interrupted[arm], arms.sessions[arm]
    return arms.completed[arm], arms.sessions[arm]


def breached(arms: Arms, defn: ExperimentDef) -> np.ndarray:
    """Runs in which any guardrail of ``defn`` is breached now (treatment = arm 1)."""
    alpha = defn.test_alpha
    out = np.zeros(arms.ok.shape[1], dtype=bool)
    for g in defn.guardrails:
        per_arm = alpha if g.kind == "level" else alpha / 2.0
        bounds = []
        if "_p" in g.metric:
            src, digits = g.metric.split("_p")
            q = int(digits) / 10 ** len(digits)
            for arm in (1, 0):
                bounds.append(_quantile_bounds(arms, arm, LATENCY[src], q, per_arm))
            n_t, n_c = arms.requests[1], arms.requests[0]
            need = defn.min_samples.requests
        else:
            for arm in (1, 0):
                bounds.append(bernoulli_cs(*_proportion(arms, arm, g.metric), per_arm))
            sess = g.metric != "success_rate"
            n_t = arms.sessions[1] if sess else arms.requests[1]
            n_c = arms.sessions[0] if sess else arms.requests[0]
            need = defn.min_samples.sessions if sess else defn.min_samples.requests
        (tl, th), (cl, ch) = bounds
        lo, hi = _effect(g, tl, th, cl, ch)
        hit = lo > g.limit if g.bound == "max" else hi < g.limit
        out |= hit & (n_t >= need) & (n_c >= need)
    return out


def _effect(
    g: Guardrail, tl: np.ndarray, th: np.ndarray, cl: np.ndarray, ch: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    if g.kind == "level":
        return tl, th
    if g.kind == "diff":
        return tl - ch, th - cl
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ch > 0, tl / ch, 0.0), np.where(cl > 0, th / cl, np.inf)


def monitor(
    pool: Pool,
    runs: int,
    max_per_arm: int,
    step: int,
    ttft_factor: float,
    rng: np.random.Generator,
    chunk: int = 500,
) -> tuple[np.ndarray, int]:
    """Per run, the requests per arm at the first rollback (0: never). Returns (that, looks)."""
    defn = _guard_def()
    finite = pool.values[~np.isnan(pool.values)]
    lo, hi = int(bucket_index([finite.min() / 2])[0]), int(bucket_index([finite.max() * 2])[0]) + 1
    first = np.zeros(runs, dtype=np.int64)
    looks = max_per_arm // step
    n_pool = pool.ok.size
    for start in range(0, runs, chunk):
        r = min(chunk, runs - start)
        arms = Arms(r, lo, hi)
        done = np.zeros(r, dtype=np.int64)
        for look in range(1, looks + 1):
            for arm in (0, 1):
                idx = rng.integers(0, n_pool, (r, step))
                values = pool.values[:, idx]
                if arm == 1 and ttft_factor != 1.0:
                    extra = values[0] * (ttft_factor - 1.0)
                    values = values.copy()
                    values[0] = values[0] + extra
                    values[2] = values[2] + extra
                arms.add(arm, pool.ok[idx], values, rng)
            hit = breached(arms, defn) & (done == 0)
            done[hit] = look * step
        first[start : start + r] = done
    return first, looks


def srm_rates(
    runs: int, units: int, step: int, p_treatment: float, alpha: float, rng: np.random.Generator
) -> dict[str, float]:
    """Share of runs flagged (guard rule), flagged by chi-square alone (monitored), and at
    the fixed horizon only."""
    looks = units // step
    increments = rng.binomial(step, p_treatment, (runs, looks))
    treat = np.cumsum(increments, axis=1)
    n = step * np.arange(1, looks + 1)
    counts = np.stack([n - treat, treat], axis=-1)
    w = np.array([0.5, 0.5])
    chi2 = chi_square_gof(counts, w)
    crit = chi2_isf(alpha, 1)
    log_bf = srm_log_bf(counts, w)
    running = np.maximum.accumulate(log_bf, axis=1)
    guard = ((chi2 > crit) & (running >= math.log(1.0 / alpha))).any(axis=1)
    return {
        "flagged_by_guard": float(guard.mean()),
        "flagged_by_chi2_monitored": float((chi2 > crit).any(axis=1).mean()),
        "flagged_by_chi2_fixed_horizon": float((chi2[:, -1] > crit).mean()),
    }


def scipy_check() -> dict[str, Any]:
    """The guard's p-values and e-values against scipy's on fixed-horizon cases."""
    try:
        from scipy import stats
    except ImportError:
        return {"skipped": "scipy not installed (pip install -e '.[dev]')"}
    from tailguard.streams.experiment import fixed_horizon_p
    from tailguard.streams.sequential import bernoulli_log_e, srm_test

    rng = np.random.default_rng(7)
    worst_p = worst_e = worst_bf = 0.0
    cases = 0
    for _ in range(200):
        n = int(rng.integers(50, 200_000))
        k = int(rng.binomial(n, rng.uniform(0.3, 0.7)))
        ours = srm_test([n - k, k], [0.5, 0.5])
        ref = stats.chisquare([n - k, k]).pvalue
        worst_p = max(worst_p, abs(ours.p_value - ref) / max(ref, 1e-300))
        a, b = int(rng.integers(1, 5000)), int(rng.integers(1, 5000))
        c, d = int(rng.integers(1, 5000)), int(rng.integers(1, 5000))
        mine = fixed_horizon_p(((a, b), (c, d)))
        theirs = stats.chi2_contingency([[a, b], [c, d]], correction=False).pvalue
        assert mine is not None
        worst_p = max(worst_p, abs(mine - theirs) / max(theirs, 1e-300))
        q = float(rng.uniform(0.01, 0.99))
        e = float(bernoulli_log_e(k, n, q, 0.5, 0.5))
        e_ref = stats.betabinom.logpmf(k, n, 0.5, 0.5) - stats.binom.logpmf(k, n, q)
        worst_e = max(worst_e, abs(e - e_ref) / max(1.0, abs(e_ref)))
        x = np.array([n - k, k])
        bf_ref = stats.dirichlet_multinomial.logpmf(
            x, [500.0, 500.0], n
        ) - stats.multinomial.logpmf(x, n, [0.5, 0.5])
        worst_bf = max(worst_bf, abs(ours.log_bf - bf_ref) / max(1.0, abs(bf_ref)))
        cases += 3
    return {
        "cases": cases,
        "max_relative_error_fixed_horizon_p": worst_p,
        "max_relative_error_beta_binomial_log_e": worst_e,
        "max_relative_error_srm_log_bf": worst_bf,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--max-per-arm", type=int, default=20_000)
    parser.add_argument("--step", type=int, default=100, help="requests per arm per update")
    parser.add_argument("--srm-runs", type=int, default=10_000)
    parser.add_argument("--srm-units", type=int, default=100_000)
    parser.add_argument("--srm-step", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--quick", action="store_true", help="100 runs: a smoke test")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.srm_runs = 100, 2_000
    rng = np.random.default_rng(args.seed)
    began = time.monotonic()
    pool = simulator_pool(300.0, seed=args.seed % 1000)
    t_pool = time.monotonic() - began

    aa, looks = monitor(pool, args.runs, args.max_per_arm, args.step, 1.0, rng)
    t_aa = time.monotonic()
    reg, _ = monitor(pool, args.runs, args.max_per_arm, args.step, 1.2, rng)
    t_reg = time.monotonic()
    srm_bad = srm_rates(args.srm_runs, args.srm_units, args.srm_step, 0.51, 0.001, rng)
    srm_fair = srm_rates(args.srm_runs, args.srm_units, args.srm_step, 0.50, 0.001, rng)
    t_srm = time.monotonic()
    detected = reg[reg > 0]
    defn = _guard_def()
    result = {
        "runs": args.runs,
        "aa_false_rollback_rate": float((aa > 0).mean()),
        "regression_detection_rate": float((reg > 0).mean()),
        "median_requests_per_arm": float(np.median(detected)) if detected.size else None,
        "p90_requests_per_arm": float(np.percentile(detected, 90)) if detected.size else None,
        "srm_detection_rate": srm_bad["flagged_by_guard"],
        "srm_false_rate": srm_fair["flagged_by_guard"],
        "srm_false_rate_chi2_monitored": srm_fair["flagged_by_chi2_monitored"],
        "srm_false_rate_chi2_fixed_horizon": srm_fair["flagged_by_chi2_fixed_horizon"],
        "srm_detection_rate_chi2_fixed_horizon": srm_bad["flagged_by_chi2_fixed_horizon"],
        "srm_runs": args.srm_runs,
        "setup": {
            "updates_per_run": looks,
            "requests_per_arm_per_update": args.step,
            "max_requests_per_arm": args.max_per_arm,
            "regression": "treatment TTFT x1.2 (P95 +20%), E2E up by the same milliseconds",
            "guardrails": [g.describe() for g in DEFAULT_GUARDRAILS],
            "alpha_family": defn.alpha,
            "alpha_per_comparison": defn.test_alpha,
            "min_requests_per_arm": defn.min_samples.requests,
            "srm": (
                f"{args.srm_units} units planned 50/50, checked every {args.srm_step}; "
                "detection: P(treatment) = 0.51; false: 0.50; alarm: chi-square p < 0.001 "
                "and sequential p < 0.001"
            ),
            "latency_source": "tailguard simulator default fleet, 300 s at 200 req/s, i.i.d. draws",
        },
        "scipy": scipy_check(),
        "seconds": {
            "pool": round(t_pool, 1),
            "aa": round(t_aa - began - t_pool, 1),
            "regression": round(t_reg - t_aa, 1),
            "srm": round(t_srm - t_reg, 1),
        },
        "machine": machine("numpy, one process"),
    }
    write_result("ab_guard", result)
    for key in (
        "aa_false_rollback_rate",
        "regression_detection_rate",
        "median_requests_per_arm",
        "srm_detection_rate",
        "srm_false_rate",
    ):
        print(f"{key}: {result[key]}")


if __name__ == "__main__":
    run(main)
