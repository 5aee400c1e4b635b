"""Turn a merged window bucket into the SLI figures published on ``tailguard.sli``.

- percentiles P50/P90/P95/P99/P99.9 of TTFT, TPOT, ITL (per gap) and E2E;
- ``success_rate`` = 1 − errors / requests (cancelled requests are not errors);
- ``slo_compliance`` = w_ttft · TTFT compliance + w_itl · ITL compliance
  (0.7 / 0.3 by default, the article's composite SLI); a component with no
  samples counts as compliant;
- ``goodput_rps`` = requests that met every latency threshold / window seconds
  (DistServe; vLLM ``--goodput``).
"""

from dataclasses import dataclass, field
from typing import Any

from tailguard.streams.attribution import STAGE_PREFIX
from tailguard.streams.bucket import METRICS, Bucket
from tailguard.streams.digest import to_tdigest_dict
from tailguard.streams.sli import Thresholds

__all__ = ["PERCENTILES", "WindowSummary", "summarize"]

#: Published percentile names and their quantiles.
PERCENTILES: dict[str, float] = {
    "p50": 0.50,
    "p90": 0.90,
    "p95": 0.95,
    "p99": 0.99,
    "p999": 0.999,
}


@dataclass(slots=True)
class WindowSummary:
    """SLI figures of one series over one window."""

    window_ms: int
    count: int
    errors: int
    cancelled: int
    success_rate: float
    ttft_compliance: float
    itl_compliance: float
    slo_compliance: float
    goodput_rps: float
    latency: dict[str, dict[str, float | int | None]]
    exemplars: list[str]
    digests: dict[str, dict[str, Any]] | None = None
    #: Per-stage percentiles (``stages_ms`` of the events), by stage name.
    stages: dict[str, dict[str, float | int | None]] = field(default_factory=dict)


def _ratio(good: int, total: int) -> float:
    return 1.0 if total == 0 else good / total


def summarize(
    bucket: Bucket, window_ms: int, thresholds: Thresholds, *, with_digests: bool = False
) -> WindowSummary:
    """SLI figures of a merged window (see the module docstring for definitions)."""
    c = bucket.counters
    latency: dict[str, dict[str, float | int | None]] = {}
    qs = list(PERCENTILES.values())
    for metric in METRICS:
        sketch = bucket.digests.get(metric)
        n = sketch.n_values if sketch is not None else 0
        row: dict[str, float | int | None] = {"count": n}
        values = sketch.quantiles(qs) if sketch is not None and n else [None] * len(qs)
        row.update(zip(PERCENTILES, values, strict=True))
        latency[metric] = row
    stages: dict[str, dict[str, float | int | None]] = {}
    for name in sorted(bucket.digests):
        if name.startswith(STAGE_PREFIX):
            sketch = bucket.digests[name]
            row = {"count": sketch.n_values}
            row.update(zip(PERCENTILES, sketch.quantiles(qs), strict=True))
            stages[name[len(STAGE_PREFIX) :]] = row
    ttft_c = _ratio(c.ttft_good, c.ttft_total)
    itl_c = _ratio(c.itl_good, c.itl_total)
    digests = None
    if with_digests:
        digests = {m: to_tdigest_dict(d) for m, d in bucket.digests.items()}
    return WindowSummary(
        window_ms=window_ms,
        count=c.requests,
        errors=c.errors,
        cancelled=c.cancelled,
        success_rate=_ratio(c.requests - c.errors, c.requests),
        ttft_compliance=ttft_c,
        itl_compliance=itl_c,
        slo_compliance=thresholds.ttft_weight * ttft_c + thresholds.itl_weight * itl_c,
        goodput_rps=c.good_requests / (window_ms / 1000.0),
        latency=latency,
        exemplars=[trace for _, trace in bucket.exemplars],
        digests=digests,
        stages=stages,
    )
