"""Breach evaluation: SLOs against burn rates at every closed minute, lifecycle, publishing.

Runs inside the SLI agent (it needs the series' window state and writes the
breach state table co-partitioned with it). For every minute bucket that the
event-time watermark closes, in order:

1. the exact counters of every window the burn policy reads, ending there;
2. ``evaluate`` each SLO that applies to the series (SRE workbook multi-window
   multi-burn-rate rules, minimum-traffic gate);
3. ``advance`` the (series, SLO) lifecycle; every transition becomes a
   ``tailguard.breach.v1`` event with exemplars and the joined GPU samples.

At the same closed minute the silent-collapse detector
(:mod:`~tailguard.streams.silent`) judges the series' short window against
its learned baseline and publishes ``kind: silent_degradation`` breaches.
Every breach, of either kind, carries the ranked causes of the violating
requests of the last 5 minutes (``attribution``,
:func:`~tailguard.streams.attribution.rank_causes`) and the top 3 stages by
P99 increase over the baseline (``stages``).

Everything but the GPU join (wall-clock ages) is a function of the events, so
replaying the same input yields the same breach ids and sequence.
"""

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tailguard.agents.bulk import BulkWriter, read_partition, write_by_key
from tailguard.agents.gpu import gpu_join
from tailguard.agents.internal import Series, series_key
from tailguard.agents.publish import frame
from tailguard.agents.state import CachedSeries
from tailguard.streams import WINDOWS, Bucket, WindowSummary
from tailguard.streams.attribution import STAGE_PREFIX, rank_causes, stage_increases
from tailguard.streams.breach import BreachPolicy, BreachState, Transition, advance
from tailguard.streams.burn import (
    BurnPolicy,
    SloSpec,
    applicable,
    evaluate,
)
from tailguard.streams.burn_windows import (
    WindowCounters,
    fires_each,
    short_windows_burn,
    window_counters,
)
from tailguard.streams.prompt_evidence import rank_prompts
from tailguard.streams.silent import (
    KIND as SILENT_KIND,
)
from tailguard.streams.silent import (
    SilentPolicy,
    SilentState,
    SilentTransition,
    WindowStats,
    advance_silent,
    stats_of,
)

__all__ = [
    "BREACH_SCHEMA",
    "BreachEngine",
    "Summarised",
    "breach_payload",
    "silent_payload",
    "window_stats",
]

BREACH_SCHEMA = "tailguard.breach.v1"
_SEP = "\x1f"
_SILENT = "~silent"
_MINUTE_MS = 60_000
#: Windows a minute's close read and summarised, by ``(id(ring), window_ms, end_ms)``:
#: the merged bucket and its summary. Valid while the close runs (nothing is folded
#: in between, and every ring it names is alive).
Summarised = Mapping[tuple[int, int, int], tuple[Bucket, WindowSummary | None]]


def window_stats(
    bucket: Bucket, window_ms: int, summary: WindowSummary | None = None
) -> WindowStats:
    """What the silent detector reads of a merged window: counters, TTFT P95, stage P99s.

    ``summary``: the window's summary, when the close made one already (its
    percentiles are what the window's sketches give, to the bit)."""
    if summary is not None:
        return stats_of(
            bucket.counters,
            window_ms,
            summary.latency["ttft_ms"]["p95"],
            {name: row["p99"] for name, row in summary.stages.items() if row["count"]},
        )
    ttft = bucket.digests.get("ttft_ms")
    p95 = ttft.quantiles([0.95])[0] if ttft is not None and ttft.n_values else None
    stages = {
        name[len(STAGE_PREFIX) :]: sketch.quantiles([0.99])[0]
        for name, sketch in sorted(bucket.digests.items())
        if name.startswith(STAGE_PREFIX) and sketch.n_values
    }
    return stats_of(bucket.counters, window_ms, p95, stages)


def _explain(
    bucket: Bucket,
    window_ms: int,
    baseline_rates: list[float] | tuple[float, ...] | None,
    baseline_stages: dict[str, float],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``attribution`` and ``stages`` of a breach from its window and the series' baseline."""
    stats = window_stats(bucket, window_ms)
    causes = rank_causes(bucket.counters, baseline_rates or None)
    return [c.as_dict() for c in causes], stage_increases(stats.stage_p99_ms, baseline_stages)


def breach_payload(
    t: Transition,
    series: Series,
    *,
    exemplars: list[str],
    gpu: list[dict[str, Any]],
    now_ms: int,
    attribution: list[dict[str, Any]] | None = None,
    stages: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The ``tailguard.breach.v1`` event of one lifecycle transition."""
    service, model, variant, tenant = series
    return {
        "schema": BREACH_SCHEMA,
        "event_id": t.event_id,
        "ts_ms": now_ms,
        "breach_id": t.breach_id,
        "state": t.state,
        "seq": t.seq,
        "kind": "burn_rate",
        "severity": t.severity,
        "slo": t.slo,
        "series": {"service": service, "model": model, "variant": variant, "tenant": tenant},
        "at_ms": t.at_ms,
        "burn_rates": dict(t.burn_rates),
        "peak_burn_rates": dict(t.peak_burn_rates),
        "rules": list(t.rules),
        "reason": t.reason,
        "sli": dict(t.sli),
        "budget_remaining": t.budget_remaining,
        "exemplars": exemplars,
        "attribution": attribution or [],
        "stages": stages or [],
        "gpu": gpu,
        "gpu_note": None if gpu else "no GPU known for this series (no host/gpu_ids in its events)",
        "opened_ms": t.opened_ms,
        "resolved_ms": t.resolved_ms,
    }


def silent_payload(
    t: SilentTransition,
    series: Series,
    *,
    exemplars: list[str],
    gpu: list[dict[str, Any]],
    now_ms: int,
    attribution: list[dict[str, Any]],
    stages: list[dict[str, Any]],
) -> dict[str, Any]:
    """The ``tailguard.breach.v1`` event of one silent-collapse transition."""
    service, model, variant, tenant = series
    sli = t.sli
    if t.state == "resolved":
        reason = "latency SLO attainment is back within its normal band"
    else:
        reason = (
            f"latency SLO attainment {_pct(sli.get('attainment'))} "
            f"(baseline {_pct(sli.get('baseline_attainment'))}), TTFT P95 "
            f"{sli.get('p95_ttft_ms')} ms (baseline {sli.get('baseline_p95_ttft_ms')} ms), "
            f"while the error rate ({_pct(sli.get('error_rate'))}) and the request rate "
            f"({sli.get('rate_rps')}/s) look normal"
        )
    return {
        "schema": BREACH_SCHEMA,
        "event_id": t.event_id,
        "ts_ms": now_ms,
        "breach_id": t.breach_id,
        "state": t.state,
        "seq": t.seq,
        "kind": SILENT_KIND,
        "severity": t.severity,
        "slo": "latency_attainment",
        "series": {"service": service, "model": model, "variant": variant, "tenant": tenant},
        "at_ms": t.at_ms,
        "burn_rates": {},
        "peak_burn_rates": {},
        "rules": [],
        "reason": reason,
        "sli": dict(sli),
        "budget_remaining": None,
        "exemplars": exemplars,
        "attribution": attribution,
        "stages": stages,
        "gpu": gpu,
        "gpu_note": None if gpu else "no GPU known for this series (no host/gpu_ids in its events)",
        "opened_ms": t.opened_ms,
        "resolved_ms": t.resolved_ms,
    }


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100.0 * value:.2f} %"


@dataclass
class BreachEngine:
    """SLOs, policies and the breach state table of one worker."""

    slos: Sequence[SloSpec]
    state_table: Any
    gpu_table: Any
    #: Checkpoints write the changed states through it in bulk (None: key by key).
    writer: BulkWriter | None = None
    burn: BurnPolicy = field(default_factory=BurnPolicy)
    lifecycle: BreachPolicy = field(default_factory=BreachPolicy)
    silent: SilentPolicy = field(default_factory=SilentPolicy)
    #: Window whose slowest requests are attached as exemplars.
    exemplar_window_ms: int = WINDOWS["1h"]
    #: Optional :class:`~tailguard.agents.telemetry.Telemetry` shown on /metrics and the dashboard.
    telemetry: Any = None
    #: Bumped when ``slos`` changes at run time (admin ``slo set``): the SLI agent
    #: then re-resolves each series' SLOs (:mod:`tailguard.agents.control`).
    slo_version: int = 0
    #: Called with each breach payload before it is framed: the admin plane marks
    #: silenced / acknowledged breaches and audits the decision (may change it).
    on_payload: Callable[[dict[str, Any]], None] | None = None
    #: Prompt version → prompt group (the prompt registry, :mod:`tailguard.agents.prompts`);
    #: ``None``: versions are listed without their groups.
    prompt_group_of: Callable[[str], str | None] | None = None
    #: Breach states changed since their partition's last checkpoint.
    _states: dict[bytes, bytes] = field(default_factory=dict)
    _unsaved: dict[int, set[bytes]] = field(default_factory=dict)
    #: What the table holds (None: nothing) for every state read or written here,
    #: per partition: a minute's close reads five states of every series, and
    #: most series have none to read.
    _known: dict[int, dict[bytes, bytes | None]] = field(default_factory=dict)
    #: Per partition, series with no state for any of their SLOs (read or written
    #: here), under the SLO list they were read for: a quiet close of one, none of
    #: whose SLOs may fire, has nothing to read (most series at most minutes).
    _stateless: dict[int, dict[str, list[SloSpec]]] = field(default_factory=dict)

    def specs_for(self, series: Series) -> list[SloSpec]:
        return applicable(self.slos, *series)

    def evaluate_many(
        self, closes: Sequence[tuple[Series, str, CachedSeries, list[SloSpec], int]]
    ) -> list[list[Transition]]:
        """:meth:`evaluate` of each close (series, key, state, SLOs, end), in order;
        the short windows of all of them screened at once first
        (:func:`short_windows_burn`): a close none of whose short windows burns
        has no SLO that fires, and needs no rule read one by one."""
        counters = [window_counters(c.state, self.burn, end) for _, _, c, _, end in closes]
        burns = short_windows_burn(
            self.burn, [(specs, wc) for (*_, specs, _), wc in zip(closes, counters, strict=True)]
        )
        return [
            self.evaluate(series, key, cached, end, specs, counters=wc, may_fire=burn)
            for (series, key, cached, specs, end), wc, burn in zip(
                closes, counters, burns, strict=True
            )
        ]

    def evaluate(
        self,
        series: Series,
        key: str,
        cached: CachedSeries,
        end_ms: int,
        specs: list[SloSpec],
        *,
        counters: WindowCounters | None = None,
        may_fire: bool = True,
    ) -> list[Transition]:
        """Evaluate every SLO of the series at ``end_ms``; store and return the transitions.

        ``counters``: the series' windows ending at ``end_ms``, when read already;
        ``may_fire``: False when no rule's short window burns for any SLO
        (:func:`short_windows_burn`), so that no rule fires."""
        if not specs:
            return []
        if counters is None:
            counters = window_counters(cached.state, self.burn, end_ms)
        watched = self.telemetry is not None and self.telemetry.watches(key)
        out: list[Transition] = []
        # Which SLOs burn, all read at once (only needed where the verdict
        # itself is not: no breach state, not on /metrics).
        burning: list[bool] | None = None
        stateless = self._stateless.setdefault(cached.partition, {})
        if not watched:
            if not may_fire and stateless.get(key) is specs:
                return []  # nothing burns, and no SLO of the series has a state
            burning = fires_each(specs, self.burn, counters) if may_fire else [False] * len(specs)
        stateless[key] = specs  # until a state is read or written below
        for i, spec in enumerate(specs):
            skey = f"{key}{_SEP}{spec.name}".encode()
            raw = self._read(skey, cached.partition)
            if raw is not None:
                stateless.pop(key, None)
            elif burning is not None and not burning[i]:
                # Quiet, no breach state, not on /metrics: no verdict is read.
                continue
            state = (
                BreachState.from_bytes(raw, key=skey)
                if raw is not None
                else BreachState(series_key=key, slo=spec.name)
            )
            verdict = evaluate(spec, self.burn, counters)
            if verdict.severity is None and not state.is_open:
                # Quiet, as most series are at most minutes: advancing would only
                # move the state's last_at_ms, which a quiet state never stores.
                new, transitions = state, ()
            else:
                new, transitions = advance(state, end_ms, verdict, self.lifecycle)
            if self.telemetry is not None:
                self.telemetry.observe_slo(key, spec.name, verdict, new, end_ms)
            # Persist only real changes: a quiet (series, SLO) would otherwise write
            # a changelog record every minute just to move ``last_at_ms``. Re-running
            # an unpersisted quiet evaluation after a crash gives the same verdict,
            # so nothing is lost by not remembering it.
            if transitions or new.is_open:
                self._states[skey] = new.to_bytes()
                self._unsaved.setdefault(cached.partition, set()).add(skey)
                stateless.pop(key, None)
            out.extend(transitions)
        return out

    def _read(self, skey: bytes, partition: int) -> bytes | None:
        """The newest state of ``skey``: unsaved, else known, else read from the table."""
        raw = self._states.get(skey)
        if raw is not None:
            return raw
        known = self._known.setdefault(partition, {})
        if skey in known:
            return known[skey]
        raw = known[skey] = read_partition(self.state_table, partition, skey)
        return raw

    def _silent_state(self, key: str, partition: int) -> tuple[bytes, SilentState]:
        skey = f"{key}{_SEP}{_SILENT}".encode()
        raw = self._read(skey, partition)
        state = (
            SilentState.from_bytes(raw, key=skey)
            if raw is not None
            else SilentState(series_key=key)
        )
        return skey, state

    def evaluate_silent(
        self,
        key: str,
        cached: CachedSeries,
        end_ms: int,
        summarised: Summarised | None = None,
    ) -> list[SilentTransition]:
        """Judge the short window ending at ``end_ms`` for a silent collapse; learn the minute.

        ``summarised``: the windows a close read and summarised already (see
        :data:`Summarised`); the minute and the short window are read again only
        when they are not there."""
        skey, state = self._silent_state(key, cached.partition)
        short_ms = self.silent.short_window_ms
        ring = id(cached.state)
        minute_read = summarised.get((ring, _MINUTE_MS, end_ms)) if summarised else None
        short_read = summarised.get((ring, short_ms, end_ms)) if summarised else None
        if minute_read is None or short_read is None:
            minute_bucket, short_bucket = cached.state.windows([_MINUTE_MS, short_ms], end_ms)
            minute_read = (minute_bucket, minute_read[1] if minute_read else None)
            short_read = (short_bucket, None)
        minute_bucket, short_bucket = minute_read[0], short_read[0]
        minute = window_stats(minute_bucket, _MINUTE_MS, minute_read[1])
        short = (
            minute.over(short_ms)  # a young series: the same buckets
            if short_bucket is minute_bucket
            else window_stats(short_bucket, short_ms, short_read[1])
        )
        new, transitions = advance_silent(state, end_ms, minute, short, self.silent)
        if new is not state:
            self._states[skey] = new.to_bytes()
            self._unsaved.setdefault(cached.partition, set()).add(skey)
        return transitions

    def explain(
        self, key: str, cached: CachedSeries, at_ms: int
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """``attribution`` and ``stages`` of a breach of the series at ``at_ms``."""
        _, state = self._silent_state(key, cached.partition)
        base = state.baseline
        short_ms = self.silent.short_window_ms
        bucket = cached.state.window(short_ms, at_ms)
        rates = base.factor_rates if base.minutes else None
        return _explain(bucket, short_ms, rates, dict(base.stage_p99_ms))

    def prompt_evidence(
        self, cached: CachedSeries, at_ms: int
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Prompt versions and groups holding most bad requests of the short window at ``at_ms``."""
        bucket = cached.state.window(self.silent.short_window_ms, at_ms)
        c = bucket.counters
        return rank_prompts(
            bucket.prompts,
            total_requests=c.requests,
            total_bad=c.requests - c.cancelled - c.good_requests,
            group_of=self.prompt_group_of,
        )

    def take(self, partition: int) -> list[tuple[bytes, bytes]]:
        """The breach states changed on ``partition`` since the last take, to
        :meth:`write` once the transitions they produced are on the broker (a
        crash then replays the evaluation and re-sends, same ``event_id``, rather
        than remembering a transition nobody received)."""
        known = self._known.setdefault(partition, {})
        puts = [(skey, self._states.pop(skey)) for skey in sorted(self._unsaved.pop(partition, ()))]
        known.update(puts)
        return puts

    def untake(self, partition: int, puts: list[tuple[bytes, bytes]]) -> None:
        """``puts`` (of :meth:`take`) were not written: taken again next time."""
        for skey, value in puts:
            if skey not in self._states:
                self._states[skey] = value
                self._unsaved.setdefault(partition, set()).add(skey)

    def write(self, partition: int, puts: list[tuple[bytes, bytes]]) -> int:
        """Write ``puts`` (of :meth:`take`) to the state table; returns the keys written."""
        if self.writer is not None:
            return self.writer.write(self.state_table, partition, puts)
        return write_by_key(self.state_table, puts, ())

    def forget_partitions(self, partitions: set[int]) -> None:
        """Drop unwritten states of partitions that moved away (their input is replayed)."""
        for partition in partitions:
            self._known.pop(partition, None)
            self._stateless.pop(partition, None)
            for skey in self._unsaved.pop(partition, set()):
                self._states.pop(skey, None)

    def payloads(
        self,
        transitions: Sequence[Transition | SilentTransition],
        series: Series,
        cached: CachedSeries,
        source: str,
    ) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
        if not transitions:
            return []
        now = int(time.time() * 1000)
        # One join per batch of transitions: they share the series' GPUs and "now".
        gpu = gpu_join(self.gpu_table, sorted(cached.gpus), now)
        framed = []
        key = series_key(*series)
        for t in transitions:
            exemplars = cached.state.exemplars(self.exemplar_window_ms, t.at_ms)
            attribution, stages = self.explain(key, cached, t.at_ms)
            if isinstance(t, SilentTransition):
                payload = silent_payload(
                    t,
                    series,
                    exemplars=exemplars,
                    gpu=gpu,
                    now_ms=now,
                    attribution=attribution,
                    stages=stages,
                )
            else:
                payload = breach_payload(
                    t,
                    series,
                    exemplars=exemplars,
                    gpu=gpu,
                    now_ms=now,
                    attribution=attribution,
                    stages=stages,
                )
            payload["prompts"], payload["prompt_groups"] = self.prompt_evidence(cached, t.at_ms)
            if self.on_payload is not None:
                self.on_payload(payload)
            if self.telemetry is not None:
                self.telemetry.observe_breach(payload)
            framed.append(frame(payload, source=source))
        return framed


def thresholds_resolver(slos: Sequence[SloSpec]) -> Callable[[str], Any]:
    """Series key → the ingest thresholds its SLOs need (``service|model|variant|tenant``)."""
    from tailguard.streams.burn import thresholds_for

    def resolve(key: str) -> Any:
        service, model, variant, tenant = key.split("|", 3)
        return thresholds_for(applicable(slos, service, model, variant, tenant))

    return resolve
