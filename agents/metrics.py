"""Prometheus exposition of a worker (``GET /metrics``), from :mod:`~tailguard.agents.telemetry`.

Nothing here runs on the hot path: a scrape walks the telemetry registry,
the worker's counters (:class:`~tailguard.agents.stats.WorkerStats`) and
the faust consumer's offsets, and renders them with ``prometheus-client``
(a custom collector, so no gauge is touched per event). Durations are in
seconds, ratios in [0, 1] (Prometheus naming conventions; ``promtool check
metrics`` passes on the output — tested).

Metric families (``S`` = the series labels ``service, model, variant, tenant``):

- ``tailguard_sli_latency_seconds{S, window, metric, percentile}``: percentile of
  the last final SLI snapshot; metric ttft/tpot/itl/e2e, percentile p50 … p999;
- ``tailguard_sli_requests`` / ``_errors`` / ``_success_ratio`` /
  ``_slo_compliance_ratio`` (+ ttft, itl) / ``_goodput_requests_per_second`` /
  ``_window_end_timestamp_seconds`` ``{S, window}``;
- ``tailguard_slo_burn_rate{S, slo, window}`` (5m … 3d),
  ``tailguard_slo_budget_remaining_ratio{S, slo}``,
  ``tailguard_slo_breach_state{S, slo}`` (0 none open, 1 ticket, 2 page);
- ``tailguard_breach_open{S, slo, kind, severity}`` (1 per open breach),
  ``tailguard_breaches_open{kind, severity}``,
  ``tailguard_breach_transitions_total{kind, state, severity}``;
- the worker's counters, e.g. ``tailguard_events_processed_total`` (:data:`COUNTERS`),
  ``tailguard_deadletters_total{reason}``;
- ``tailguard_consumer_lag_messages{topic, partition}`` (highwater − committed),
  with ``_highwater_offset`` and ``_committed_offset``;
- ``tailguard_release_decisions_total{decision}``, ``tailguard_experiments``;
- ``tailguard_metrics_series`` / ``_series_limit`` / ``_series_refused_total``
  (the cardinality cap, :mod:`~tailguard.agents.telemetry`), and the
  ``process_*`` families of prometheus-client.
"""

import math
from collections.abc import Callable, Iterator
from dataclasses import fields
from typing import Any, TypeGuard

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from tailguard.agents.telemetry import SEVERITY_LEVEL, Telemetry, label_value

__all__ = [
    "CONTENT_TYPE",
    "COUNTERS",
    "GUARD_COUNTERS",
    "Collected",
    "TelemetryCollector",
    "consumer_lag",
    "make_registry",
    "order_guard_counts",
    "render",
]

#: Content type of the text exposition format 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: WorkerStats field → (metric name without ``_total``, help). Numeric fields not
#: listed here are exported as ``tailguard_worker_<field>_total``.
COUNTERS: dict[str, tuple[str, str]] = {
    "messages": ("tailguard_input_messages", "Input messages consumed by the ingest agents."),
    "messages_columnar": (
        "tailguard_input_messages_columnar",
        "Input messages in the columnar form (tailguard.inference.columns.v1); the rest are rows.",
    ),
    "events_valid": ("tailguard_events_valid", "Input events that passed validation."),
    "events_local": (
        "tailguard_events_local",
        "Valid events folded on the input partition they came in on (one broker hop).",
    ),
    "events_forwarded": (
        "tailguard_events_forwarded",
        "Valid events forwarded to their series' partition through tailguard.internal.series.",
    ),
    "events_applied": (
        "tailguard_events_processed",
        "Events folded into the sliding windows (late and duplicate ones excluded).",
    ),
    "late": (
        "tailguard_events_late",
        "Events older than the allowed lateness (counted, not merged).",
    ),
    "duplicates": ("tailguard_events_duplicate", "Events whose event_id was already counted."),
    "replayed": ("tailguard_events_replayed", "Events of input already absorbed (re-delivery)."),
    "snapshots": ("tailguard_sli_snapshots_published", "tailguard.sli.v1 snapshots published."),
    "gpu_samples": ("tailguard_gpu_samples", "NVML samples stored by the GPU agent."),
    "breach_events": ("tailguard_breach_events_published", "tailguard.breach.v1 events published."),
    "checkpoints": ("tailguard_checkpoints", "State checkpoints of the SLI agent."),
    "state_writes": ("tailguard_state_writes", "Table records written at checkpoints."),
    "checkpoint_seconds": (
        "tailguard_checkpoint_seconds",
        "Wall time the SLI agent spent in checkpoints (writing state, acknowledging input).",
    ),
    "close_seconds": (
        "tailguard_close_seconds",
        "Wall time spent closing minutes (final snapshots, SLO and silent evaluations).",
    ),
    "gc_seconds": (
        "tailguard_gc_seconds",
        "Time the cyclic garbage collector ran (it holds the interpreter lock meanwhile).",
    ),
    "batches": (
        "tailguard_ingest_batches",
        "Ingest batches taken (valid events / batches: a fold's size).",
    ),
    "decode_seconds": (
        "tailguard_ingest_decode_seconds",
        "Wall time the ingest agent spent decoding and validating input messages.",
    ),
    "dispatch_seconds": (
        "tailguard_ingest_dispatch_seconds",
        "Wall time the ingest agent spent forwarding and feeding the A/B, prompt and "
        "capacity paths.",
    ),
    "fold_seconds": (
        "tailguard_ingest_fold_seconds",
        "Wall time the ingest agent spent folding (minute closes included, checkpoints not).",
    ),
    "capacity_in_place": (
        "tailguard_capacity_requests_in_place",
        "Requests applied to their deployment's capacity state by the ingest itself.",
    ),
    "capacity_forwarded": (
        "tailguard_capacity_requests_forwarded",
        "Requests forwarded through tailguard.internal.capacity to their deployment's owner.",
    ),
    "internal_errors": ("tailguard_internal_errors", "Undecodable internal records skipped."),
    "redelivered": ("tailguard_input_redelivered", "Input messages delivered again."),
}

_SERIES = ["service", "model", "variant", "tenant"]
_LATENCY = {"ttft_ms": "ttft", "tpot_ms": "tpot", "itl_ms": "itl", "e2e_ms": "e2e"}
_PERCENTILES = ("p50", "p90", "p95", "p99", "p999")
_RATIOS = {
    "success_rate": ("tailguard_sli_success_ratio", "Share of requests that did not fail."),
    "slo_compliance": (
        "tailguard_sli_slo_compliance_ratio",
        "Composite latency SLO compliance (weighted TTFT and ITL compliance).",
    ),
    "ttft_compliance": (
        "tailguard_sli_ttft_compliance_ratio",
        "Share of requests within the TTFT threshold.",
    ),
    "itl_compliance": (
        "tailguard_sli_itl_compliance_ratio",
        "Share of inter-token gaps within the ITL threshold.",
    ),
}

LagSource = Callable[[], list[dict[str, Any]]]
#: The in-order guard's counters (:class:`tailguard.agents.offsets.InOrderGuard`).
GuardSource = Callable[[], dict[str, int]]

#: Guard counter → (metric name without ``_total``, help).
GUARD_COUNTERS: dict[str, tuple[str, str]] = {
    "dropped": (
        "tailguard_consumer_stale_records_dropped",
        "Records fetched before a rebalance seek and dropped: the log is read again from "
        "the committed offset. Steady growth means frequent rebalances.",
    ),
    "holes": (
        "tailguard_consumer_holes_reread",
        "Times a partition's records skipped offsets and the consumer sought back to read "
        "the missing ones.",
    ),
    "gaps": (
        "tailguard_consumer_gaps_acknowledged",
        "Offset gaps found again right after a seek back and acknowledged as absent from "
        "the log (transaction markers, compaction, retention).",
    ),
}


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and math.isfinite(value)


class TelemetryCollector(Collector):
    """Collects every ``tailguard_*`` family at scrape time."""

    def __init__(
        self,
        telemetry: Telemetry,
        lag: LagSource | None = None,
        guard: GuardSource | None = None,
    ) -> None:
        self.telemetry = telemetry
        self.lag = lag or (lambda: [])
        self.guard = guard or (lambda: {})

    def collect(self) -> Iterator[Metric]:
        t = self.telemetry
        t.prune()
        yield from self._series_families(t)
        yield from self._breach_families(t)
        yield from self._counter_families(t)
        yield from self._lag_families()
        yield from self._guard_families()
        info = InfoMetricFamily("tailguard_worker", "The worker process.", labels=["source"])
        info.add_metric([t.source], {"max_series": str(t.max_series)})
        yield info
        start = GaugeMetricFamily(
            "tailguard_worker_start_time_seconds", "Unix time the worker's telemetry started."
        )
        start.add_metric([], t.started_s)
        yield start

    def _series_families(self, t: Telemetry) -> Iterator[Metric]:
        sw = [*_SERIES, "window"]
        latency = GaugeMetricFamily(
            "tailguard_sli_latency_seconds",
            "Latency percentile of the last final SLI snapshot (TTFT, TPOT, ITL per gap, E2E).",
            labels=[*sw, "metric", "percentile"],
        )
        requests = GaugeMetricFamily(
            "tailguard_sli_requests", "Requests in the window (final snapshot).", labels=sw
        )
        errors = GaugeMetricFamily(
            "tailguard_sli_errors", "Failed requests in the window (final snapshot).", labels=sw
        )
        goodput = GaugeMetricFamily(
            "tailguard_sli_goodput_requests_per_second",
            "Requests per second that met every latency SLO of their series (DistServe goodput).",
            labels=sw,
        )
        end = GaugeMetricFamily(
            "tailguard_sli_window_end_timestamp_seconds",
            "Event-time end of the window of the last final snapshot.",
            labels=sw,
        )
        ratios = {
            name: GaugeMetricFamily(metric, help_, labels=sw)
            for name, (metric, help_) in _RATIOS.items()
        }
        burn = GaugeMetricFamily(
            "tailguard_slo_burn_rate",
            "Error-budget burn rate of an SLO over a window at the last closed minute.",
            labels=[*_SERIES, "slo", "window"],
        )
        budget = GaugeMetricFamily(
            "tailguard_slo_budget_remaining_ratio",
            "Share of the 30-day error budget left, projected from the longest window.",
            labels=[*_SERIES, "slo"],
        )
        state = GaugeMetricFamily(
            "tailguard_slo_breach_state",
            "Burn-rate breach of the SLO: 0 none open, 1 ticket, 2 page.",
            labels=[*_SERIES, "slo"],
        )
        for _key, labels, entry in t.series_items():
            for window, p in list(entry.final.items()):
                lw = [*labels, window]
                for field, metric in _LATENCY.items():
                    row = p.get(field) or {}
                    for q in _PERCENTILES:
                        v = row.get(q)
                        if _finite(v):
                            latency.add_metric([*lw, metric, q], v / 1000.0)
                requests.add_metric(lw, p.get("count") or 0)
                errors.add_metric(lw, p.get("errors") or 0)
                if _finite(p.get("goodput_rps")):
                    goodput.add_metric(lw, p["goodput_rps"])
                if _finite(p.get("window_end_ms")):
                    end.add_metric(lw, p["window_end_ms"] / 1000.0)
                for name, fam in ratios.items():
                    if _finite(p.get(name)):
                        fam.add_metric(lw, p[name])
            for slo, v in list(entry.slos.items()):
                ls = [*labels, slo]
                for window, rate in v.burn_rates.items():
                    if _finite(rate):
                        burn.add_metric([*ls, window], rate)
                if _finite(v.budget_remaining):
                    budget.add_metric(ls, v.budget_remaining)
                state.add_metric(ls, SEVERITY_LEVEL.get(v.severity, 0))
        yield from (latency, requests, errors, goodput, end, *ratios.values(), burn, budget, state)
        tracked = GaugeMetricFamily(
            "tailguard_metrics_series",
            "Series exported with their own labels (at most the configured cap).",
        )
        tracked.add_metric([], len(t))
        yield tracked
        cap = GaugeMetricFamily(
            "tailguard_metrics_series_limit", "Cap on the series exported with their own labels."
        )
        cap.add_metric([], t.max_series)
        yield cap
        refused = CounterMetricFamily(
            "tailguard_metrics_series_refused",
            "Observations of series beyond the cap (not exported).",
        )
        refused.add_metric([], t.series_refused)
        yield refused

    def _breach_families(self, t: Telemetry) -> Iterator[Metric]:
        open_ = GaugeMetricFamily(
            "tailguard_breach_open",
            "1 for every open breach this worker published (any kind).",
            labels=[*_SERIES, "slo", "kind", "severity"],
        )
        by_kind: dict[tuple[str, str], int] = {}
        for payload in list(t.open_breaches.values()):
            s = payload.get("series") or {}
            kind = str(payload.get("kind"))
            severity = str(payload.get("severity"))
            labels = [label_value(str(s.get(name, ""))) for name in _SERIES]
            open_.add_metric([*labels, str(payload.get("slo")), kind, severity], 1)
            by_kind[(kind, severity)] = by_kind.get((kind, severity), 0) + 1
        yield open_
        count = GaugeMetricFamily(
            "tailguard_breaches_open",
            "Open breaches by kind and severity.",
            labels=["kind", "severity"],
        )
        for (kind, severity), n in sorted(by_kind.items()):
            count.add_metric([kind, severity], n)
        yield count
        transitions = CounterMetricFamily(
            "tailguard_breach_transitions",
            "Breach transitions published, by kind, state and severity.",
            labels=["kind", "state", "severity"],
        )
        for (kind, state, severity), n in sorted(t.transitions.items()):
            transitions.add_metric([kind, state, severity], n)
        yield transitions
        decisions = CounterMetricFamily(
            "tailguard_release_decisions",
            "Release decisions (tailguard.release.v1) recorded, by decision.",
            labels=["decision"],
        )
        for decision, n in sorted(t.decision_counts.items()):
            decisions.add_metric([decision], n)
        yield decisions
        experiments = GaugeMetricFamily(
            "tailguard_experiments", "Experiments known to the release guard."
        )
        experiments.add_metric([], len(t.experiments))
        yield experiments

    def _counter_families(self, t: Telemetry) -> Iterator[Metric]:
        stats = t.stats
        for f in fields(stats):
            value = getattr(stats, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            name, help_ = COUNTERS.get(
                f.name, (f"tailguard_worker_{f.name}", f"WorkerStats.{f.name} of this worker.")
            )
            fam = CounterMetricFamily(name, help_)
            fam.add_metric([], value)
            yield fam
        dead = CounterMetricFamily(
            "tailguard_deadletters",
            "Input records sent to tailguard.deadletter, by reason.",
            labels=["reason"],
        )
        for reason, n in sorted(stats.deadletters.items()):
            dead.add_metric([reason], n)
        yield dead

    def _lag_families(self) -> Iterator[Metric]:
        tp = ["topic", "partition"]
        lag = GaugeMetricFamily(
            "tailguard_consumer_lag_messages",
            "Messages behind: the partition's highwater minus the committed offset.",
            labels=tp,
        )
        high = GaugeMetricFamily(
            "tailguard_consumer_highwater_offset",
            "Last known end offset of an assigned partition.",
            labels=tp,
        )
        committed = GaugeMetricFamily(
            "tailguard_consumer_committed_offset",
            "Offset the worker has committed (next to read after a restart).",
            labels=tp,
        )
        for row in self.lag():
            labels = [row["topic"], str(row["partition"])]
            if row.get("highwater") is not None:
                high.add_metric(labels, row["highwater"])
            if row.get("committed") is not None:
                committed.add_metric(labels, row["committed"])
            if row.get("lag") is not None:
                lag.add_metric(labels, row["lag"])
        yield from (lag, high, committed)

    def _guard_families(self) -> Iterator[Metric]:
        counts = self.guard()
        for key, (name, help_) in GUARD_COUNTERS.items():
            fam = CounterMetricFamily(name, help_)
            fam.add_metric([], counts.get(key, 0))
            yield fam


def order_guard_counts(app: Any) -> dict[str, int]:
    """The worker consumer's in-order guard counters (empty before the consumer starts)."""
    from faust.exceptions import ConsumerNotStarted

    try:
        guard = getattr(app.consumer, "order_guard", None)
    except ConsumerNotStarted:
        return {}
    if guard is None:
        return {}
    return {"dropped": guard.dropped, "holes": guard.holes, "gaps": guard.gaps}


def consumer_lag(app: Any) -> list[dict[str, Any]]:
    """Highwater, committed offset and lag of each input partition the worker's consumer holds.

    Reads what faust already tracks (no broker round trip): the highwater is
    the end offset of the last fetch response, the committed offset the one
    faust last committed (``None`` before the first commit of this worker;
    the lag is then counted from the read position). Changelog partitions
    (restored, not consumed) are left out.
    """
    from faust.exceptions import ConsumerNotStarted

    try:
        consumer = app.consumer
        assigned = consumer.assignment()
    except ConsumerNotStarted:
        return []
    acking = app.topics.acks_enabled_for
    rows = []
    for tp in sorted(assigned):
        if not acking(tp.topic):
            continue
        try:
            highwater = consumer.highwater(tp)
        except ConsumerNotStarted:
            return []
        committed = consumer._committed_offset.get(tp)  # faust keeps no public accessor
        read = consumer._read_offset.get(tp)
        position = committed if committed is not None else (None if read is None else read + 1)
        lag = None
        if highwater is not None and position is not None:
            lag = max(0, highwater - position)
        rows.append(
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "highwater": highwater,
                "committed": committed,
                "lag": lag,
            }
        )
    return rows


def make_registry(
    telemetry: Telemetry, lag: LagSource | None = None, guard: GuardSource | None = None
) -> CollectorRegistry:
    """A registry with the tailguard collector and the process collector (RSS, CPU, fds)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TelemetryCollector(telemetry, lag, guard))
    ProcessCollector(registry=registry)
    return registry


class Collected:
    """The families of a registry, collected now; :func:`render` them later, anywhere.

    Collecting reads the live registry and must run on the worker's event
    loop; formatting the text is the expensive part (prometheus-client
    validates and escapes every label of every sample: ~40 µs a sample, about
    0.5 s for the ~12 k samples of 100 series) and runs in a thread, so a
    scrape does not stall the agents.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.families = list(registry.collect())

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def render(registry: CollectorRegistry | Collected) -> bytes:
    """The text exposition of ``registry``."""
    return generate_latest(registry)
