"""What a worker shows about itself: an in-memory registry behind ``/metrics`` and the dashboard.

The agents already compute everything an operator wants to see; this module
only *keeps the latest* of it, so serving it costs nothing on the hot path:

==========================  ==============================================  =====================
fed by                      call                                            kept
==========================  ==============================================  =====================
SLI agent, every snapshot   :meth:`Telemetry.observe_sli`                   newest payload per
(final and provisional)                                                     (series, window)
BreachEngine.evaluate,      :meth:`Telemetry.observe_slo`                   burn rates, budget and
every closed minute                                                         lifecycle per series/SLO
BreachEngine.payloads,      :meth:`Telemetry.observe_breach`                open breaches (payload),
every breach transition                                                     recently resolved ones
experiment guard            :func:`record_release`, :func:`record_experiment`  latest decision per
(``tailguard.release.v1``)                                                  experiment, decision log
==========================  ==============================================  =====================

Every call is a few dictionary writes that keep a *reference* to a payload
the agent built anyway (a snapshot, framed without a payload dict, is decoded
from its JSON for a series that is shown); nothing is copied, merged or
rendered until a scrape or a dashboard poll asks (:meth:`Telemetry.view`,
:mod:`tailguard.agents.metrics`).

Bounded cardinality: at most ``max_series`` series are tracked (first come,
first kept; ``TAILGUARD_METRICS_MAX_SERIES``, default 100). A series whose
last observation is older than ``stale_after_s`` (default 15 min wall clock)
is dropped at the next scrape and frees its slot; observations of series
beyond the cap are counted (``tailguard_metrics_series_refused_total``), not
kept. Open breaches are capped at ``max_open_breaches``, the resolved ones
and the decision log are short ring buffers, experiments at ``max_experiments``.
Label values longer than :data:`MAX_LABEL_CHARS` are cut.

Rebalances: a worker only shows the series of the partitions it owns; the SLI
agent calls :meth:`Telemetry.forget_partitions` for partitions that moved away.
After a restart, an open burn-rate breach reappears (as ``tracked: false``,
without its evidence) at the next closed minute of its series and with its
full payload at its next transition.

Other agents publishing ``tailguard.breach.v1`` or ``tailguard.release.v1``
events call the module functions, which feed the worker's active registry::

    from tailguard.agents import telemetry
    telemetry.record_release(payload)                    # the tailguard.release.v1 dict
    telemetry.record_experiment("exp-42", status="running", arms=["control", "treatment"])
    telemetry.record_breach(payload)                     # a tailguard.breach.v1 dict
"""

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import msgspec
from tailguard.agents.internal import partition_for, series_key
from tailguard.agents.stats import WorkerStats
from tailguard.schemas.placement import series_of_key

__all__ = [
    "MAX_LABEL_CHARS",
    "SEVERITY_LEVEL",
    "SloView",
    "Telemetry",
    "activate",
    "active",
    "label_value",
    "record_breach",
    "record_experiment",
    "record_release",
]

#: Longest label value exported; longer service/model/... names are cut.
MAX_LABEL_CHARS = 100
#: ``tailguard_slo_breach_state``: lifecycle severity of an open breach as a number.
SEVERITY_LEVEL: dict[str | None, int] = {None: 0, "ticket": 1, "page": 2}

Series = tuple[str, str, str, str]


@dataclass(slots=True)
class SloView:
    """The latest burn-rate evaluation of one (series, SLO)."""

    burn_rates: Mapping[str, float]
    budget_remaining: float | None
    #: Severity of the open breach (``None``: no breach open).
    severity: str | None
    breach_id: str | None
    opened_ms: int | None
    at_ms: int
    #: Severity the rules fire at this minute (``None``: none fires).
    firing: str | None


@dataclass(slots=True)
class _SeriesEntry:
    series: Series
    #: window → newest snapshot payload (provisional or final).
    latest: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: window → newest final snapshot payload.
    final: dict[str, dict[str, Any]] = field(default_factory=dict)
    slos: dict[str, SloView] = field(default_factory=dict)
    seen: float = 0.0


def label_value(value: str) -> str:
    """``value`` cut to :data:`MAX_LABEL_CHARS` (an ellipsis marks the cut)."""
    return value if len(value) <= MAX_LABEL_CHARS else value[: MAX_LABEL_CHARS - 1] + "…"


class Telemetry:
    """Latest SLIs, burn rates, breaches and release decisions of one worker."""

    def __init__(
        self,
        *,
        stats: WorkerStats | None = None,
        partitions: int = 1,
        max_series: int = 100,
        stale_after_s: float = 900.0,
        max_open_breaches: int = 1_000,
        max_resolved: int = 50,
        max_experiments: int = 200,
        max_decisions: int = 100,
        source: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_series < 0:
            msg = f"max_series must be ≥ 0, got {max_series}"
            raise ValueError(msg)
        self.stats = stats if stats is not None else WorkerStats()
        self.partitions = max(partitions, 1)
        self.max_series = max_series
        self.stale_after_s = stale_after_s
        self.max_open_breaches = max_open_breaches
        self.max_experiments = max_experiments
        self.source = source
        self._clock = clock
        self.started_s = clock()
        self._series: dict[str, _SeriesEntry] = {}
        self.series_refused = 0
        self.open_breaches: dict[str, dict[str, Any]] = {}
        self.breaches_refused = 0
        self.resolved: deque[dict[str, Any]] = deque(maxlen=max_resolved)
        #: (kind, state, severity) → transitions seen (re-sent ones after a crash included).
        self.transitions: Counter[tuple[str, str, str]] = Counter()
        self.experiments: dict[str, dict[str, Any]] = {}
        self.decisions: deque[dict[str, Any]] = deque(maxlen=max_decisions)
        self.decision_counts: Counter[str] = Counter()
        self._decision_ids: deque[str] = deque(maxlen=max_decisions * 4)
        self._lock = threading.Lock()  # release/experiment calls may come from other threads

    # ------------------------------------------------------------------ feeding

    def watches(self, key: str) -> bool:
        """Whether what a series does now reaches ``/metrics`` (it is shown, or
        there is room to show it)."""
        return key in self._series or len(self._series) < self.max_series

    def _entry(self, key: str, series: Series | None = None) -> _SeriesEntry | None:
        entry = self._series.get(key)
        if entry is None:
            if len(self._series) >= self.max_series:
                self.series_refused += 1
                return None
            entry = _SeriesEntry(series=series or series_of_key(key))
            self._series[key] = entry
        entry.seen = self._clock()
        return entry

    def observe_sli(self, series: Series, window: str, payload: dict[str, Any] | bytes) -> None:
        """A ``tailguard.sli.v1`` snapshot was published (hot path: two dict writes).

        ``payload``: the snapshot, or its JSON as published (decoded only for a
        series that is shown: a close publishes tens of thousands)."""
        entry = self._entry(series_key(*series), series)
        if entry is None:
            return
        if isinstance(payload, bytes):
            payload = msgspec.json.decode(payload)
        entry.latest[window] = payload
        if payload.get("final"):
            entry.final[window] = payload

    def observe_slo(self, key: str, slo: str, verdict: Any, state: Any, at_ms: int) -> None:
        """One SLO of a series was evaluated at a closed minute.

        ``verdict``: the :class:`~tailguard.streams.burn.Verdict`; ``state``: the
        :class:`~tailguard.streams.breach.BreachState` after the step.
        """
        entry = self._entry(key)
        if entry is None:
            return
        entry.slos[slo] = SloView(
            burn_rates=verdict.burn_rates,
            budget_remaining=verdict.budget_remaining,
            severity=state.severity if state.is_open else None,
            breach_id=state.breach_id,
            opened_ms=state.opened_ms,
            at_ms=at_ms,
            firing=verdict.severity,
        )

    def observe_breach(self, payload: dict[str, Any]) -> None:
        """A ``tailguard.breach.v1`` transition was published (any kind)."""
        breach_id = str(payload.get("breach_id"))
        state = str(payload.get("state"))
        kind = str(payload.get("kind", "burn_rate"))
        self.transitions[(kind, state, str(payload.get("severity")))] += 1
        with self._lock:
            if state == "resolved":
                self.open_breaches.pop(breach_id, None)
                self.resolved.appendleft(payload)
                return
            if (
                breach_id not in self.open_breaches
                and len(self.open_breaches) >= self.max_open_breaches
            ):
                self.breaches_refused += 1
                return
            self.open_breaches[breach_id] = payload

    def record_release(self, payload: Mapping[str, Any]) -> None:
        """A ``tailguard.release.v1`` decision was published (idempotent per ``event_id``)."""
        experiment = str(payload.get("experiment", "?"))
        event_id = payload.get("event_id")
        with self._lock:
            if event_id is not None:
                if event_id in self._decision_ids:
                    return
                self._decision_ids.append(str(event_id))
            decision = dict(payload)
            self.decisions.appendleft(decision)
            self.decision_counts[str(payload.get("decision", "?"))] += 1
            row = self._experiment_row(experiment)
            if row is None:
                return
            row["decision"] = payload.get("decision")
            row["arm"] = payload.get("arm")
            row["reasons"] = list(payload.get("reasons") or [])
            row["weights"] = dict(payload.get("weights") or {})
            row["decided_ms"] = payload.get("ts_ms")
            row["decisions"] = int(row.get("decisions", 0)) + 1

    def record_experiment(self, experiment: str, **info: Any) -> None:
        """What the guard knows of an experiment (``status``, ``arms``, ``started_ms`` …)."""
        with self._lock:
            row = self._experiment_row(experiment)
            if row is not None:
                row.update(info)

    def _experiment_row(self, experiment: str) -> dict[str, Any] | None:
        row = self.experiments.get(experiment)
        if row is None:
            if len(self.experiments) >= self.max_experiments:
                return None
            row = {"experiment": experiment}
            self.experiments[experiment] = row
        return row

    def forget_partitions(self, partitions: Iterable[int]) -> None:
        """Drop the series (and their open breaches) of partitions that moved away."""
        gone = set(partitions)
        if not gone:
            return
        for key in [k for k in self._series if partition_for(k, self.partitions) in gone]:
            del self._series[key]
        with self._lock:
            for breach_id, payload in list(self.open_breaches.items()):
                s = payload.get("series") or {}
                key = series_key(
                    s.get("service", ""),
                    s.get("model", ""),
                    s.get("variant", ""),
                    s.get("tenant", ""),
                )
                if partition_for(key, self.partitions) in gone:
                    del self.open_breaches[breach_id]

    # ------------------------------------------------------------------ reading

    def prune(self) -> int:
        """Drop series not observed for ``stale_after_s``; returns how many."""
        cutoff = self._clock() - self.stale_after_s
        stale = [k for k, e in list(self._series.items()) if e.seen < cutoff]
        for key in stale:
            self._series.pop(key, None)
        return len(stale)

    def series_items(self) -> list[tuple[str, Series, _SeriesEntry]]:
        """Tracked series, with label values cut to :data:`MAX_LABEL_CHARS`."""
        out = []
        for key, entry in list(self._series.items()):
            labels: Series = (
                label_value(entry.series[0]),
                label_value(entry.series[1]),
                label_value(entry.series[2]),
                label_value(entry.series[3]),
            )
            out.append((key, labels, entry))
        return out

    def __len__(self) -> int:
        return len(self._series)

    def view(self, *, limit: int = 200, lag: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Everything the dashboard shows, as plain JSON-able data."""
        self.prune()
        now_s = self._clock()
        stats = self.stats
        counters = {
            f.name: getattr(stats, f.name)
            for f in fields(stats)
            if isinstance(getattr(stats, f.name), int | float)
        }
        counters["deadletters"] = sum(stats.deadletters.values())
        breached = set()
        with self._lock:
            open_breaches = [_breach_view(p) for p in self.open_breaches.values()]
            resolved = [_breach_view(p) for p in self.resolved]
            experiments = [dict(row) for row in self.experiments.values()]
            decisions = list(self.decisions)
        for b in open_breaches:
            s = b["series"]
            breached.add(series_key(s["service"], s["model"], s["variant"], s["tenant"]))
        known_ids = {b["breach_id"] for b in open_breaches} | {b["breach_id"] for b in resolved}
        rows = []
        for key, _labels, entry in self.series_items():
            slos: list[dict[str, Any]] = []
            for slo, v in sorted(entry.slos.items()):
                slos.append(
                    {
                        "slo": slo,
                        "state": v.severity or "ok",
                        "firing": v.firing,
                        "burn_rates": dict(v.burn_rates),
                        "max_burn_rate": max(v.burn_rates.values(), default=0.0),
                        "budget_remaining": v.budget_remaining,
                        "at_ms": v.at_ms,
                    }
                )
                if v.breach_id and v.breach_id not in known_ids:
                    # Open since before this worker started: no evidence until it transitions.
                    known_ids.add(v.breach_id)
                    breached.add(key)
                    open_breaches.append(
                        {
                            "breach_id": v.breach_id,
                            "state": "open",
                            "tracked": False,
                            "kind": "burn_rate",
                            "severity": v.severity,
                            "slo": slo,
                            "series": _series_dict(entry.series),
                            "opened_ms": v.opened_ms,
                            "at_ms": v.at_ms,
                            "burn_rates": dict(v.burn_rates),
                            "budget_remaining": v.budget_remaining,
                            "attribution": [],
                            "stages": [],
                            "gpu": [],
                            "exemplars": [],
                            "reason": "open before this worker started; evidence at its next "
                            "transition",
                        }
                    )
            windows = {w: _sli_view(p) for w, p in entry.latest.items()}
            rows.append(
                {
                    "key": key,
                    "series": _series_dict(entry.series),
                    "breached": key in breached,
                    "windows": windows,
                    "slos": slos,
                    "max_burn_rate": max((s["max_burn_rate"] for s in slos), default=0.0),
                    "seen_s_ago": round(now_s - entry.seen, 1),
                }
            )
        rows.sort(key=_series_order)
        open_breaches.sort(
            key=lambda b: (-SEVERITY_LEVEL.get(b.get("severity"), 0), -(b.get("at_ms") or 0))
        )
        return {
            "generated_ms": int(now_s * 1000),
            "worker": {
                "source": self.source,
                "started_ms": int(self.started_s * 1000),
                "uptime_s": round(now_s - self.started_s, 1),
                "max_series": self.max_series,
            },
            "counters": counters,
            "deadletters": dict(stats.deadletters),
            "lag": lag or [],
            "series_total": len(rows),
            "series_refused": self.series_refused,
            "series": rows[:limit],
            "breaches": {"open": open_breaches, "resolved": resolved},
            "experiments": experiments,
            "decisions": decisions,
        }


def _series_dict(series: Series) -> dict[str, str]:
    service, model, variant, tenant = series
    return {"service": service, "model": model, "variant": variant, "tenant": tenant}


def _series_order(row: dict[str, Any]) -> tuple[int, float, str]:
    values = [w.get("slo_compliance") for w in row["windows"].values()]
    compliance = min((v for v in values if v is not None), default=1.0)
    return (0 if row["breached"] else 1, compliance, row["key"])


_SLI_FIELDS = (
    "window",
    "window_end_ms",
    "final",
    "count",
    "errors",
    "success_rate",
    "ttft_compliance",
    "itl_compliance",
    "slo_compliance",
    "goodput_rps",
)
_LATENCY = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


def _sli_view(payload: dict[str, Any]) -> dict[str, Any]:
    out = {name: payload.get(name) for name in _SLI_FIELDS}
    for metric in _LATENCY:
        row = payload.get(metric) or {}
        out[metric] = {q: row.get(q) for q in ("p50", "p90", "p95", "p99", "p999", "count")}
    return out


_BREACH_FIELDS = (
    "breach_id",
    "state",
    "seq",
    "kind",
    "severity",
    "slo",
    "series",
    "at_ms",
    "opened_ms",
    "resolved_ms",
    "burn_rates",
    "peak_burn_rates",
    "rules",
    "reason",
    "sli",
    "budget_remaining",
    "attribution",
    "stages",
    "gpu",
    "gpu_note",
)


def _breach_view(payload: dict[str, Any]) -> dict[str, Any]:
    out = {name: payload.get(name) for name in _BREACH_FIELDS}
    out["exemplars"] = list(payload.get("exemplars") or [])[:5]
    out["tracked"] = True
    return out


# ---------------------------------------------------------------------- process-wide

_ACTIVE: list[Telemetry] = []


def activate(telemetry: Telemetry) -> Telemetry:
    """Make ``telemetry`` the registry the module functions feed (one worker per process)."""
    _ACTIVE[:] = [telemetry]
    return telemetry


def active() -> Telemetry:
    """The worker's registry (a detached one when no worker was built in this process)."""
    if not _ACTIVE:
        _ACTIVE.append(Telemetry())
    return _ACTIVE[0]


def record_release(payload: Mapping[str, Any]) -> None:
    """Show a ``tailguard.release.v1`` decision on the dashboard and in ``/metrics``."""
    active().record_release(payload)


def record_experiment(experiment: str, **info: Any) -> None:
    """Show an experiment's state (``status``, ``arms``, ``started_ms`` …) on the dashboard."""
    active().record_experiment(experiment, **info)


def record_breach(payload: dict[str, Any]) -> None:
    """Show a ``tailguard.breach.v1`` transition published outside the SLI agent."""
    active().observe_breach(payload)
