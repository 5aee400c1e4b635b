"""Turn a merged window bucket into the SLI figures published on ``tailguard.sli``.

- percentiles P50/P90/P95/P99/P99.9 of TTFT, TPOT, ITL (per gap) and E2E;
- ``success_rate`` = 1 − errors / requests (cancelled requests are not errors);
- ``slo_compliance`` = w_ttft · TTFT compliance + w_itl · ITL compliance
  (0.7 / 0.3 by default, the article's composite SLI); a component with no
  samples counts as compliant;
- ``goodput_rps`` = requests that met every latency threshold / window seconds
  (DistServe; vLLM ``--goodput``).
"""

from collections.abc import Sequence
from typing import Any

import msgspec
from tailguard.streams.attribution import STAGE_PREFIX
from tailguard.streams.bucket import METRICS, Bucket
from tailguard.streams.digest import Sketch, quantiles_many, to_tdigest_dict
from tailguard.streams.sli import Thresholds

__all__ = ["PERCENTILES", "WindowSummary", "summarize", "summarize_many"]

#: Published percentile names and their quantiles.
PERCENTILES: dict[str, float] = {
    "p50": 0.50,
    "p90": 0.90,
    "p95": 0.95,
    "p99": 0.99,
    "p999": 0.999,
}


class WindowSummary(msgspec.Struct):
    """SLI figures of one series over one window (a struct: a close makes
    tens of thousands, and a struct is built several times quicker than a
    dataclass)."""

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
    stages: dict[str, dict[str, float | int | None]] = {}


#: A metric's (or stage's) row per name: ``count`` and its percentiles.
_Rows = dict[str, dict[str, float | int | None]]


def _ratio(good: int, total: int) -> float:
    return 1.0 if total == 0 else good / total


def summarize(
    bucket: Bucket, window_ms: int, thresholds: Thresholds, *, with_digests: bool = False
) -> WindowSummary:
    """SLI figures of a merged window (see the module docstring for definitions)."""
    return summarize_many([(bucket, window_ms, thresholds)], with_digests=with_digests)[0]


def summarize_many(
    windows: Sequence[tuple[Bucket, int, Thresholds]], *, with_digests: bool = False
) -> list[WindowSummary]:
    """:func:`summarize` of each ``(merged bucket, window_ms, thresholds)``, percentiles
    in one pass.

    A minute's close summarises a few windows of every series that closed; the
    percentiles of all of them are computed together (:func:`quantiles_many`).
    A merged bucket read for several windows (they held the same buckets: a
    young series' 1m, 5m and 1h) is summarised once, and its windows' summaries
    share what they read of it (percentile rows, stages, exemplars): read them,
    do not change them.
    """
    qs = list(PERCENTILES.values())
    # Every (bucket, metric or stage) with values, then all their percentiles at once.
    rows_of: dict[int, _Rows] = {}
    sketches: list[Sketch] = []
    slots: list[tuple[_Rows, str, int]] = []
    for bucket, _, _ in windows:
        if id(bucket) in rows_of:
            continue
        rows = rows_of[id(bucket)] = {}
        for name, sketch in bucket.digests.items():
            n = sketch.n_values
            if n:
                sketches.append(sketch)
                slots.append((rows, name, n))
            else:
                rows[name] = _no_values()
    found = quantiles_many(sketches, qs)
    for (rows, name, n), values in zip(slots, found, strict=True):
        rows[name] = _row(n, values)
    shared: dict[int, tuple[_Rows, _Rows, list[str]]] = {}
    out = []
    for bucket, window_ms, thresholds in windows:
        parts = shared.get(id(bucket))
        if parts is None:
            rows = rows_of[id(bucket)]
            latency = {m: rows.get(m) or _no_values() for m in METRICS}
            stages = {
                name[len(STAGE_PREFIX) :]: rows[name]
                for name in sorted(rows)
                if name.startswith(STAGE_PREFIX)
            }
            parts = shared[id(bucket)] = (latency, stages, [t for _, t in bucket.exemplars])
        latency, stages, exemplars = parts
        out.append(
            _summary(bucket, window_ms, thresholds, latency, stages, exemplars, with_digests)
        )
    return out


def _row(n: int, values: Sequence[float | None]) -> dict[str, float | int | None]:
    """A metric's row: its value count, then its percentiles under the names of
    :data:`PERCENTILES`, in order (a test holds the two together). Written out:
    a minute's close builds tens of thousands of them, and a literal is four
    times quicker than zipping the names."""
    p50, p90, p95, p99, p999 = values
    return {"count": n, "p50": p50, "p90": p90, "p95": p95, "p99": p99, "p999": p999}


_NO_PERCENTILES = (None,) * len(PERCENTILES)


def _no_values() -> dict[str, float | int | None]:
    return _row(0, _NO_PERCENTILES)


def _summary(
    bucket: Bucket,
    window_ms: int,
    thresholds: Thresholds,
    latency: dict[str, dict[str, float | int | None]],
    stages: dict[str, dict[str, float | int | None]],
    exemplars: list[str],
    with_digests: bool,
) -> WindowSummary:
    c = bucket.counters
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
        exemplars=exemplars,
        digests=digests,
        stages=stages,
    )
