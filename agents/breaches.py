"""Breach evaluation: SLOs against burn rates at every closed minute, lifecycle, publishing.

Runs inside the SLI agent (it needs the series' window state and writes the
breach state table co-partitioned with it). For every minute bucket that the
event-time watermark closes, in order:

1. the exact counters of every window the burn policy reads, ending there;
2. ``evaluate`` each SLO that applies to the series (SRE workbook multi-window
   multi-burn-rate rules, minimum-traffic gate);
3. ``advance`` the (series, SLO) lifecycle; every transition becomes a
   ``tailguard.breach.v1`` event with exemplars and the joined GPU samples.

Everything but the GPU join (wall-clock ages) is a function of the events, so
replaying the same input yields the same breach ids and sequence.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tailguard.agents.gpu import gpu_join
from tailguard.agents.publish import frame
from tailguard.agents.state import CachedSeries
from tailguard.streams import WINDOWS
from tailguard.streams.breach import BreachPolicy, BreachState, Transition, advance
from tailguard.streams.burn import BurnPolicy, SloSpec, applicable, evaluate, window_counters

__all__ = ["BREACH_SCHEMA", "BreachEngine", "breach_payload"]

BREACH_SCHEMA = "tailguard.breach.v1"
_SEP = "\x1f"


def breach_payload(
    t: Transition,
    series: tuple[str, str, str, str],
    *,
    exemplars: list[str],
    gpu: list[dict[str, Any]],
    now_ms: int,
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
        "attribution": [],
        "gpu": gpu,
        "gpu_note": None if gpu else "no GPU known for this series (no host/gpu_ids in its events)",
        "opened_ms": t.opened_ms,
        "resolved_ms": t.resolved_ms,
    }


@dataclass
class BreachEngine:
    """SLOs, policies and the breach state table of one worker."""

    slos: Sequence[SloSpec]
    state_table: Any
    gpu_table: Any
    burn: BurnPolicy = field(default_factory=BurnPolicy)
    lifecycle: BreachPolicy = field(default_factory=BreachPolicy)
    #: Window whose slowest requests are attached as exemplars.
    exemplar_window_ms: int = WINDOWS["1h"]
    #: Breach states changed since their partition's last checkpoint.
    _states: dict[bytes, bytes] = field(default_factory=dict)
    _unsaved: dict[int, set[bytes]] = field(default_factory=dict)

    def specs_for(self, series: tuple[str, str, str, str]) -> list[SloSpec]:
        return applicable(self.slos, *series)

    def evaluate(
        self,
        series: tuple[str, str, str, str],
        key: str,
        cached: CachedSeries,
        end_ms: int,
        specs: list[SloSpec],
    ) -> list[Transition]:
        """Evaluate every SLO of the series at ``end_ms``; store and return the transitions."""
        if not specs:
            return []
        counters = window_counters(cached.state, self.burn, end_ms)
        out: list[Transition] = []
        for spec in specs:
            skey = f"{key}{_SEP}{spec.name}".encode()
            raw = self._states.get(skey)
            if raw is None:
                raw = self.state_table.get(skey)
            state = (
                BreachState.from_bytes(raw, key=skey)
                if raw is not None
                else BreachState(series_key=key, slo=spec.name)
            )
            verdict = evaluate(spec, self.burn, counters)
            new, transitions = advance(state, end_ms, verdict, self.lifecycle)
            # Persist only real changes: a quiet (series, SLO) would otherwise write
            # a changelog record every minute just to move ``last_at_ms``. Re-running
            # an unpersisted quiet evaluation after a crash gives the same verdict,
            # so nothing is lost by not remembering it.
            if transitions or new.is_open:
                self._states[skey] = new.to_bytes()
                self._unsaved.setdefault(cached.partition, set()).add(skey)
            out.extend(transitions)
        return out

    def checkpoint(self, partition: int) -> int:
        """Write the breach states changed on ``partition`` (inside the agent, see SeriesStore).

        Called only after the transitions they produced were flushed to the
        broker: a crash then replays the evaluation and re-sends (same
        ``event_id``) rather than remembering a transition nobody received.
        """
        keys = self._unsaved.pop(partition, set())
        for skey in sorted(keys):
            self.state_table[skey] = self._states.pop(skey)
        return len(keys)

    def forget_partitions(self, partitions: set[int]) -> None:
        """Drop unwritten states of partitions that moved away (their input is replayed)."""
        for partition in partitions:
            for skey in self._unsaved.pop(partition, set()):
                self._states.pop(skey, None)

    def payloads(
        self,
        transitions: list[Transition],
        series: tuple[str, str, str, str],
        cached: CachedSeries,
        source: str,
    ) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
        if not transitions:
            return []
        now = int(time.time() * 1000)
        # One join per batch of transitions: they share the series' GPUs and "now".
        gpu = gpu_join(self.gpu_table, sorted(cached.gpus), now)
        framed = []
        for t in transitions:
            payload = breach_payload(
                t,
                series,
                exemplars=cached.state.exemplars(self.exemplar_window_ms, t.at_ms),
                gpu=gpu,
                now_ms=now,
            )
            framed.append(frame(payload, source=source))
        return framed


def thresholds_resolver(slos: Sequence[SloSpec]) -> Callable[[str], Any]:
    """Series key → the ingest thresholds its SLOs need (``service|model|variant|tenant``)."""
    from tailguard.streams.burn import thresholds_for

    def resolve(key: str) -> Any:
        service, model, variant, tenant = key.split("|", 3)
        return thresholds_for(applicable(slos, service, model, variant, tenant))

    return resolve
