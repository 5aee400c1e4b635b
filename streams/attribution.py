"""Why requests are slow: per-request cause flags, stages, and their ranking during a breach.

Every request carries, besides its latencies, what the serving stack did to
it (the event's ``cache``, ``batch``, ``flow_control``, ``stages_ms``). Three of
those are *causes* in the article's chain of a silent SLO collapse, each a
yes/no flag per request::

    flag               bit  set when                                      article
    prefix_cache_miss   1   cache.prefix_hit_tokens / prefix_query_tokens  hit rate 98.7 → 7.3 %
                            < CACHE_MISS_BELOW (0.5)
    batch_wait          2   batch.timed_out, or batch.wait_ms ≥            min_batch 4, timeout
                            BATCH_WAIT_MS (100)                            350 ms, backoff 50 ms
    throttled           4   flow_control.throttled                         128 tokens/s

The flags are computed once, at ingest, into one ``uint8`` column; buckets
keep exact counts per flag (all requests with it, the SLO-violating ones with
it, and their TTFT sum), so any window can say, per cause:

- ``share``: of the requests that violated a latency SLO, how many had it;
- ``rate`` vs ``baseline_rate`` and ``lift`` = rate / baseline rate: how much
  more often it occurs than normally;
- ``ttft_affected_ms`` vs ``ttft_unaffected_ms``: mean TTFT with and without it.

:func:`rank_causes` orders causes by share (ties: by lift), which is the
order an operator fixes them in: a cause behind 97 % of the bad requests
before one behind 65 %. Stages (``stages_ms``) get their own digests per
bucket (``stage.<name>``); :func:`stage_increases` ranks them by how much
their P99 grew over the baseline.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "BATCH_WAIT_MS",
    "CACHE_MISS_BELOW",
    "FACTORS",
    "MAX_STAGES",
    "STAGE_PREFIX",
    "Cause",
    "factor_flags",
    "rank_causes",
    "stage_increases",
]

#: Cause flags in bit order (bit ``i`` is ``1 << i``).
FACTORS: tuple[str, ...] = ("prefix_cache_miss", "batch_wait", "throttled")
#: A request whose prefix-cache hit share is below this missed the cache.
CACHE_MISS_BELOW = 0.5
#: A batch wait of at least this many ms counts as waiting on the batcher.
BATCH_WAIT_MS = 100.0
#: Digest-name prefix of a stage in a bucket (``stage.prefill``).
STAGE_PREFIX = "stage."
#: Stages kept per bucket; further names are ignored (bounded state).
MAX_STAGES = 12
#: Longest stage name kept.
MAX_STAGE_NAME = 48


def factor_flags(events: Sequence[Any]) -> np.ndarray:
    """The ``uint8`` cause flags of each event (see the module docstring)."""
    out = np.zeros(len(events), dtype=np.uint8)
    for i, ev in enumerate(events):
        flags = 0
        cache = getattr(ev, "cache", None)
        if (
            cache is not None
            and cache.prefix_query_tokens > 0
            and cache.prefix_hit_tokens < CACHE_MISS_BELOW * cache.prefix_query_tokens
        ):
            flags |= 1
        batch = getattr(ev, "batch", None)
        if batch is not None and (
            batch.timed_out or (batch.wait_ms is not None and batch.wait_ms >= BATCH_WAIT_MS)
        ):
            flags |= 2
        flow = getattr(ev, "flow_control", None)
        if flow is not None and flow.throttled:
            flags |= 4
        if flags:
            out[i] = flags
    return out


@dataclass(frozen=True, slots=True)
class Cause:
    """One ranked cause of a window's SLO-violating requests."""

    cause: str
    share: float
    rate: float
    baseline_rate: float | None
    lift: float | None
    ttft_affected_ms: float | None
    ttft_unaffected_ms: float | None
    bad_with: int
    bad: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "share": round(self.share, 4),
            "rate": round(self.rate, 4),
            "baseline_rate": None if self.baseline_rate is None else round(self.baseline_rate, 4),
            "lift": None if self.lift is None else round(self.lift, 2),
            "ttft_affected_ms": _round(self.ttft_affected_ms),
            "ttft_unaffected_ms": _round(self.ttft_unaffected_ms),
            "bad_with": self.bad_with,
            "bad": self.bad,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


#: Lift is reported against at least this baseline rate (a cause never seen
#: before would otherwise have an infinite lift).
_RATE_FLOOR = 1e-3


def rank_causes(
    counters: Any,
    baseline_rates: Sequence[float] | None = None,
    *,
    min_share: float = 0.05,
) -> list[Cause]:
    """Causes of the violating requests in a window's ``counters``, most explaining first.

    ``counters`` is a :class:`~tailguard.streams.counters.Counters` (merged over
    the window); ``baseline_rates`` the normal rate of each factor (same
    order as :data:`FACTORS`), if known. Causes covering less than
    ``min_share`` of the bad requests are left out.
    """
    ok = counters.requests - counters.errors - counters.cancelled
    bad = ok - counters.good_requests
    if bad <= 0 or ok <= 0:
        return []
    out = []
    for i, name in enumerate(FACTORS):
        n_with, bad_with, ttft_n, ttft_sum = counters.factor_row(i)
        share = bad_with / bad
        if share < min_share:
            continue
        rate = n_with / ok
        base = None if baseline_rates is None else float(baseline_rates[i])
        lift = None if base is None else rate / max(base, _RATE_FLOOR)
        rest_n = counters.ttft_total - ttft_n
        rest_sum = counters.ttft_sum_us - ttft_sum
        out.append(
            Cause(
                cause=name,
                share=share,
                rate=rate,
                baseline_rate=base,
                lift=lift,
                ttft_affected_ms=ttft_sum / ttft_n / 1000 if ttft_n else None,
                ttft_unaffected_ms=rest_sum / rest_n / 1000 if rest_n > 0 else None,
                bad_with=bad_with,
                bad=bad,
            )
        )
    out.sort(key=lambda c: (-c.share, -(c.lift or 0.0), c.cause))
    return out


def stage_increases(
    current: Mapping[str, float], baseline: Mapping[str, float], top: int = 3
) -> list[dict[str, Any]]:
    """The ``top`` stages by P99 increase over the baseline (ms), largest first.

    A stage without a baseline is compared with 0 (it is new).
    """
    rows: list[dict[str, Any]] = []
    for stage, p99 in current.items():
        base = baseline.get(stage)
        increase = p99 - (base or 0.0)
        rows.append(
            {
                "stage": stage,
                "p99_ms": round(p99, 1),
                "baseline_p99_ms": None if base is None else round(base, 1),
                "increase_ms": round(increase, 1),
                "ratio": None if not base else round(p99 / base, 2),
            }
        )
    rows.sort(key=lambda r: (-float(r["increase_ms"]), str(r["stage"])))
    return rows[:top]
