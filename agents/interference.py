"""Interference agents: closed 1-minute points and KV minutes → ``interference`` breaches.

The detector (:mod:`tailguard.streams.interference`) must see every tenant of
a deployment (service, model) together, but series live on the partition of
their own key and ``tailguard.kv`` is keyed by instance. So both are re-keyed
onto one internal topic keyed by deployment
(:mod:`~tailguard.agents.interference_wire`)::

    series folder ── minutes a fold closed: their points ─ key service|model ─┐
    (agents/folder.py, beside the final 1m snapshots; a record per deployment) ▼
                                                     tailguard.internal.interference
    tailguard.kv ──▶ KV agent (agents/kv.py) ── closed KV minutes, ──────────▲   │
    (key: instance)                              to every partition              ▼
                                        detector ──▶ tables tailguard-interference(-kv)
                                           └──▶ tailguard.breaches (kind interference)

The points come from the fold, not from ``tailguard.sli``: one hop from the
close to the detector, and no worker reads back its own snapshots. A record
holds the points of one deployment's series that one fold closed
(:class:`~tailguard.agents.interference_wire.PointsMsg`), so the detector reads
and writes the deployment's state once a record, not once a series.

Why an internal topic and not a table: a faust table write lands in the
partition of the *current event*, so a table cannot move data between keys
of different partitions; and writing tables inside ``stream.take()`` is
broken (faust-streaming#497), so every agent here iterates
``stream.events()`` one message at a time.

State, all in RocksDB tables changelogged per partition of the internal topic:

- ``D␟service|model`` → :class:`~tailguard.streams.interference.DeploymentState`
  (series progress, victims' episodes and open breaches: a few dozen bytes a
  series of the deployment);
- ``S␟service|model|variant|tenant`` → the series' recent points
  (:class:`~tailguard.streams.interference.SeriesHistory`, ≤ 45 minutes);
  one small write per point, the deployment's histories are read only when
  a minute is evaluated;
- ``tailguard-interference-kv``: ``partition␟instance`` → the instance's KV
  minutes. Every partition receives every instance's minutes (a snapshot
  does not name its deployment), so the key carries the partition; each
  partition also keeps them in memory (a
  :class:`~tailguard.streams.interference.KvBook`, loaded from the table when
  the partition is first used after an assignment).

Breaches go out through their own librdkafka producer
(:class:`~tailguard.agents.outputs.Outputs`, CloudEvents framing of
:func:`~tailguard.agents.publish.frame`), flushed *before* the state that
records them is written: a crash can re-send a transition (same
``event_id``), never lose one. Points replayed after a crash are ignored by
the histories (one point per series and minute).

A deployment's minute is judged once every series has reported it; a series
that fell more than ``stall_minutes`` of event time behind (stopped, or a
partition that lags in a compressed replay) is waited for ``STALL_WAIT_S``
seconds of wall-clock time, then left out (counted as ``forced``). A
deployment new to this worker is first judged ``STALL_WAIT_S`` after its
first point, so series read from slower partitions have joined by then. A
deployment left waiting is sent a tick
(:class:`~tailguard.agents.interference_wire.TickMsg`) on the internal
topic when its wait is over, so that the judgement runs inside an event of
its partition (table writes go to the current event's partition) even when
no further point arrives.

The internal topic and the tables' changelogs are created when the worker is
built (:func:`~tailguard.agents.topics.precreate_topics`), not only by faust
just before it joins the group (see there why).

Cross-topic order: the detector reads a minute's KV evidence when the
minute is evaluated. KV minutes normally arrive minutes ahead of the SLI
points (which wait for the SLI agent's allowed lateness); a replay in which
KV lags the SLIs by more than that may judge a minute without its KV minute.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import faust
from faust.types import TP
from tailguard.agents.interference_wire import (
    KvMsg,
    PointMsg,
    PointsMsg,
    TickMsg,
    decode_internal,
    encode_internal,
)
from tailguard.agents.internal import partition_for, series_key
from tailguard.agents.outputs import OutputError, Outputs
from tailguard.agents.publish import frame
from tailguard.agents.settings import Settings
from tailguard.agents.stats import WorkerStats
from tailguard.agents.topics import Topics, precreate_topics
from tailguard.streams.errors import CorruptStateError
from tailguard.streams.interference import (
    KIND,
    DeploymentState,
    Gate,
    InterferencePolicy,
    InterferenceTransition,
    KvBook,
    SeriesHistory,
    explain,
    judge_ready,
    offer,
    stalled,
)
from tailguard.streams.kv import KvMinute

__all__ = [
    "BREACH_SCHEMA",
    "InterferenceStats",
    "interference_payload",
    "kv_forwarder",
    "register_interference",
]

log = logging.getLogger(__name__)

BREACH_SCHEMA = "tailguard.breach.v1"
_SEP = "\x1f"
STATE_TABLE = "tailguard-interference"
KV_TABLE = "tailguard-interference-kv"
#: Wall-clock seconds a deployment waits for a series that fell more than
#: ``stall_minutes`` of event time behind before judging minutes without it.
STALL_WAIT_S = 20.0


def interference_payload(t: InterferenceTransition, *, now_ms: int) -> dict[str, Any]:
    """The ``tailguard.breach.v1`` event of one interference transition.

    Same fields as a burn-rate breach (``burn_rates`` empty, no budget, no GPU
    join), plus ``victim``, ``neighbours`` and a one-line ``summary``; the
    evidence is in ``sli`` and the ranked neighbours in ``attribution``.
    """
    service, model, variant, tenant = t.series
    attribution = [dict(a) for a in t.attribution]
    return {
        "schema": BREACH_SCHEMA,
        "event_id": t.event_id,
        "ts_ms": now_ms,
        "breach_id": t.breach_id,
        "state": t.state,
        "seq": t.seq,
        "kind": KIND,
        "severity": t.severity,
        "slo": t.slo,
        "series": {"service": service, "model": model, "variant": variant, "tenant": tenant},
        "at_ms": t.at_ms,
        "burn_rates": {},
        "peak_burn_rates": {},
        "rules": [] if t.state == "resolved" else ["interference"],
        "reason": t.reason,
        "sli": dict(t.evidence),
        "budget_remaining": None,
        "exemplars": list(t.exemplars),
        "attribution": attribution,
        "gpu": [],
        "gpu_note": "interference breaches carry KV evidence (sli.shared_instances), not GPUs",
        "opened_ms": t.opened_ms,
        "resolved_ms": t.resolved_ms,
        "victim": t.victim,
        "neighbours": [a["tenant"] for a in attribution],
        "summary": explain(t),
    }


# ---------------------------------------------------------------- the store


def _deployment_key(deployment: str) -> bytes:
    return f"D{_SEP}{deployment}".encode()


def _series_key(deployment: str, variant: str, tenant: str) -> bytes:
    return f"S{_SEP}{deployment}|{variant}|{tenant}".encode()


def _kv_key(partition: int, instance: str) -> bytes:
    return f"{partition}{_SEP}{instance}".encode()


@dataclass(slots=True)
class InterferenceStats:
    """Counters of the interference agents (logged with the worker's stats)."""

    points: int = 0
    replayed_points: int = 0
    late_points: int = 0
    kv_minutes: int = 0
    minutes_evaluated: int = 0
    forced: int = 0
    breach_events: int = 0
    undecodable: int = 0
    corrupt_states: int = 0

    def line(self) -> str:
        return (
            f"interference_points={self.points} replayed={self.replayed_points} "
            f"late={self.late_points} kv_minutes={self.kv_minutes} "
            f"minutes_evaluated={self.minutes_evaluated} forced={self.forced} "
            f"breach_events={self.breach_events} "
            f"undecodable={self.undecodable} corrupt={self.corrupt_states}"
        )


class _Store:
    """Reads and writes of the detector's tables, plus the per-partition KV books."""

    def __init__(self, state_table: Any, kv_table: Any, stats: InterferenceStats) -> None:
        self.state_table = state_table
        self.kv_table = kv_table
        self.stats = stats
        self._books: dict[int, KvBook] = {}

    def book(self, partition: int) -> KvBook:
        book = self._books.get(partition)
        if book is None:
            book = self._books[partition] = KvBook()
            prefix = f"{partition}{_SEP}".encode()
            for key, raw in self.kv_table.items():
                if not key.startswith(prefix) or raw is None:
                    continue
                try:
                    book.load(key[len(prefix) :].decode(), KvBook.decode(raw))
                except CorruptStateError:
                    self.stats.corrupt_states += 1
        return book

    def forget(self, keep: set[int]) -> None:
        for partition in [p for p in self._books if p not in keep]:
            del self._books[partition]

    def add_kv(self, partition: int, msg: KvMsg) -> None:
        book = self.book(partition)
        if book.add(msg.instance, msg.minute):
            self.kv_table[_kv_key(partition, msg.instance)] = KvBook.encode(
                book.minutes(msg.instance)
            )
            self.stats.kv_minutes += 1

    def state(self, deployment: str, service: str, model: str) -> DeploymentState:
        raw = self.state_table.get(_deployment_key(deployment))
        if raw is not None:
            try:
                return DeploymentState.from_bytes(raw)
            except CorruptStateError:
                self.stats.corrupt_states += 1
        return DeploymentState(service=service, model=model)

    def history(self, deployment: str, variant: str, tenant: str) -> SeriesHistory:
        raw = self.state_table.get(_series_key(deployment, variant, tenant))
        if raw is not None:
            try:
                return SeriesHistory.from_bytes(raw)
            except CorruptStateError:
                self.stats.corrupt_states += 1
        return SeriesHistory(variant=variant, tenant=tenant)

    def histories(
        self, state: DeploymentState, current: SeriesHistory | None
    ) -> Callable[[], Iterable[SeriesHistory]]:
        """Lazily, every series history of the deployment (``current`` as it is in memory)."""

        def load() -> list[SeriesHistory]:
            out = []
            for skey in sorted(state.series):
                variant, tenant = skey.split("|", 1)
                if current is not None and (variant, tenant) == (current.variant, current.tenant):
                    out.append(current)
                else:
                    out.append(self.history(state.key, variant, tenant))
            return out

        return load

    def save_history(self, deployment: str, history: SeriesHistory) -> None:
        self.state_table[_series_key(deployment, history.variant, history.tenant)] = (
            history.to_bytes()
        )

    def save_state(self, state: DeploymentState) -> None:
        self.state_table[_deployment_key(state.key)] = state.to_bytes()


def _declare(app: faust.App, settings: Settings, name: str, help_: str) -> Any:
    return app.Table(
        name,
        default=None,
        partitions=settings.partitions,
        key_type=bytes,
        value_type=bytes,
        options=settings.rocksdb_options(),
        help=help_,
    )


# ------------------------------------------------------------------ agents


def kv_forwarder(topics: Topics, settings: Settings) -> Callable[[str, KvMinute], Awaitable[None]]:
    """``forward(instance, minute)`` for the KV agent: one record to every partition."""

    async def forward(instance: str, minute: KvMinute) -> None:
        value = encode_internal(KvMsg(instance=instance, minute=minute))
        for partition in range(settings.partitions):
            await topics.interference.send(key=instance.encode(), value=value, partition=partition)

    return forward


def register_interference(
    app: faust.App,
    topics: Topics,
    settings: Settings,
    stats: WorkerStats,
    policy: InterferencePolicy | None = None,
) -> Any:
    """Attach the SLI forwarder, the detector and their tables; returns the detector agent."""
    policy = policy or InterferencePolicy()
    counters = InterferenceStats()
    store = _Store(
        _declare(app, settings, STATE_TABLE, "interference detector per deployment"),
        _declare(app, settings, KV_TABLE, "KV minutes per instance (detector)"),
        counters,
    )
    outputs = Outputs(settings.broker)
    breach_topic = topics.breaches.get_topic_name()
    internal_topic = topics.interference.get_topic_name()
    precreate_topics(settings, [internal_topic], [STATE_TABLE, KV_TABLE])
    first_seen: dict[str, float] = {}  # deployment → monotonic time of its first point here
    blocked: dict[str, float] = {}  # deployment → monotonic time it started waiting
    waiting: dict[str, tuple[str, str, float]] = {}  # deployment → (service, model, due)

    def gate(state: DeploymentState) -> Gate:
        """Hold a new deployment's first judgement until its series had ``STALL_WAIT_S``
        to show up; judge without a stalled series only once it had as long to catch up.
        A deployment left waiting gets a tick (:class:`TickMsg`) when its wait is over."""
        now = time.monotonic()
        key = state.key
        first = first_seen.setdefault(key, now)
        if state.evaluated_ms is None and now - first < STALL_WAIT_S:
            waiting[key] = (state.service, state.model, first + STALL_WAIT_S)
            return "hold"
        if not stalled(state, policy):
            blocked.pop(key, None)
            waiting.pop(key, None)
            return "wait"
        since = blocked.setdefault(key, now)
        if now - since < STALL_WAIT_S:
            waiting[key] = (state.service, state.model, since + STALL_WAIT_S)
            return "wait"
        blocked.pop(key, None)
        waiting.pop(key, None)
        counters.forced += 1
        return "force"

    async def publish(transitions: list[InterferenceTransition]) -> None:
        now = int(time.time() * 1000)
        framed = []
        for t in transitions:
            value, headers = frame(interference_payload(t, now_ms=now), source=settings.source)
            framed.append((series_key(*t.series).encode(), value, headers))
        delay = 0.5
        while True:
            for key, value, headers in framed:
                outputs.send(breach_topic, key, value, headers)
            try:
                await outputs.flush()
                break
            except OutputError as exc:
                # The broker is away: keep the state unchanged and send again.
                app.log.warning("tailguard: interference breaches not delivered yet: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        counters.breach_events += len(framed)
        stats.breach_events += len(framed)

    @app.agent(topics.interference, name="tailguard.interference")
    async def detector(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            partition = event.message.partition
            try:
                msg = decode_internal(event.value)
            except ValueError as exc:
                counters.undecodable += 1
                app.log.error("tailguard: skipping undecodable interference record: %s", exc)
                continue
            if isinstance(msg, KvMsg):
                store.add_kv(partition, msg)
                continue
            if isinstance(msg, PointsMsg | PointMsg):
                await take_points(partition, msg.points if isinstance(msg, PointsMsg) else [msg])
                continue
            state = store.state(msg.deployment, msg.service, msg.model)
            if isinstance(msg, TickMsg):
                if state.first_ms is None:
                    continue  # no point of this deployment here (yet)
                done = judge_ready(
                    state,
                    store.histories(state, None),
                    store.book(partition),
                    policy,
                    gate,
                )
                counters.minutes_evaluated += len(done.evaluated)
                if done.transitions:
                    await publish(done.transitions)
                if done.evaluated:
                    store.save_state(state)

    async def take_points(partition: int, points: list[PointMsg]) -> None:
        """Offer ``points`` in order; each deployment's state is read once and
        written once, after its points (if any was taken)."""
        states: dict[str, DeploymentState] = {}
        taken: set[str] = set()
        for msg in points:
            deployment = msg.deployment
            state = states.get(deployment)
            if state is None:
                state = states[deployment] = store.state(deployment, msg.service, msg.model)
            history = store.history(deployment, msg.variant, msg.tenant)
            done = offer(
                state,
                history,
                msg.point,
                msg.exemplars,
                store.histories(state, history),
                store.book(partition),
                policy,
                gate,
            )
            if not done.accepted:
                counters.replayed_points += 1
                continue
            taken.add(deployment)
            counters.points += 1
            counters.late_points += done.late
            counters.minutes_evaluated += len(done.evaluated)
            store.save_history(deployment, history)
            if done.transitions:
                await publish(done.transitions)
        for deployment in taken:
            store.save_state(states[deployment])

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        store.forget({tp.partition for tp in assigned if tp.topic == internal_topic})
        # Waits of deployments that moved away are their new owner's business.
        first_seen.clear()
        blocked.clear()
        waiting.clear()

    @app.timer(1.0, name="tailguard.interference.ticks")  # type: ignore[untyped-decorator]
    async def tick_waiting() -> None:
        now = time.monotonic()
        for key, (service, model, due) in list(waiting.items()):
            if now < due:
                continue
            waiting.pop(key, None)
            await topics.interference.send(
                key=key.encode(),
                value=encode_internal(TickMsg(service=service, model=model)),
                partition=partition_for(key, settings.partitions),
            )

    @app.timer(settings.stats_interval_s, name="tailguard.interference.stats")  # type: ignore[untyped-decorator]
    async def log_interference_stats() -> None:
        app.log.info("tailguard %s", counters.line())

    return detector
