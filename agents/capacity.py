"""Capacity agent: throughput knee, scaling, warm-up, MoE expert breakers, RAG threshold.

::

    ingest (validated events) ──apply in place──────────────────────────▶ capacity state
       │ (deployments whose partition is here)                              │
       └──forward──▶ tailguard.internal.capacity ──▶ capacity agent ────────┤
         (deployments of other workers: their columns,                      ├─▶ tailguard.capacity
          one message per partition and batch)                              │
    GpuCache (latest tailguard.gpu sample per host:gpu) ──join─────────────┤
                                                                            └─▶ tailguard.audit

The maths lives in :mod:`tailguard.streams.knee`, :mod:`~tailguard.streams.capacity`,
:mod:`~tailguard.streams.breaker` and :mod:`~tailguard.streams.rag`; everything
is decided on event time, and event ids are derived from (kind, subject, event
time, decision), so a replay of the same events publishes the same records.

State lives in the RocksDB table ``tailguard-capacity`` (changelogged, one
partition per partition of the internal topic, to which each deployment hashes),
as bytes of :mod:`tailguard.streams.capacity_state`::

    C␟service|model          core: load window, published knee, scaling
                             hysteresis and episode, warm-up, GPUs seen, offset
                             of the last applied message
    K␟service|model          knee history, recent candidates, published knee
                             (written only when a load interval closed)
    E␟service|model          expert breakers and recent expert traffic
    R␟service|model␟index    one RAG index: similarity window and threshold
    O␟service|model␟n        segment n: E2E values added to the open load
                             intervals since the segment before (deleted once
                             its intervals closed, or once a segment holding
                             every open value replaced it)

The ingest applies the requests of the deployments whose partition is
assigned here itself (:func:`register_capacity`'s ``forward``); the others go
to the partition's owner through the internal topic. A message there holds the
requests of one ingest batch for the deployments of one partition (a
deployment always hashes to the same one), as columns per deployment, at most
2,000 requests (the wire format: :mod:`~tailguard.agents.capacity_columns`).
Either way, each deployment is read from the table once (then kept in memory
until the next partition assignment, :mod:`~tailguard.agents.capacity_store`),
its requests are applied (:func:`~tailguard.agents.capacity_apply.apply_rows`),
the records they produced are delivered, then the state that changed is
written — experts, indexes and the knee (only when an interval closed) first,
the core (with the offset of the last internal message applied) last — and
delivered before the input that holds the requests is acknowledged (the agent
delivers it at once; the ingest with its checkpoint, or before it acknowledges
input it forwarded). An internal message at or below a deployment's stored offset
was applied to it already and is skipped for it; why each crash point loses
and invents nothing is in docs/capacity.md.

The ingest acknowledges its input at checkpoints, so after a crash it applies
or forwards again the requests since the last one. Every row
therefore carries the input position of its event (runs of
:mod:`~tailguard.streams.input_marks`), the core keeps the newest position
applied per input partition, and a row at or below it is skipped
(``replayed_rows``).
"""

import asyncio
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import faust
import msgspec
from faust.types import TP
from tailguard.agents.bulk import BulkWriter
from tailguard.agents.capacity_apply import (
    Breaker,
    Deployment,
    Interval,
    RagChange,
    Warmup,
    apply_rows,
)
from tailguard.agents.capacity_columns import (
    MAX_BYTES,
    MAX_ROWS,
    CapacityRows,
    Group,
    decode_message,
    messages,
    partition_of,
)
from tailguard.agents.capacity_store import CapacityStore, Writes
from tailguard.agents.capacity_tuning import CapacityTuning
from tailguard.agents.outputs import OutputError, Outputs
from tailguard.agents.publish import frame
from tailguard.agents.settings import Settings
from tailguard.agents.stats import WorkerStats
from tailguard.agents.topics import internal_topic, precreate_topics
from tailguard.streams.capacity import HOLD, Decision
from tailguard.streams.errors import CorruptStateError
from tailguard.streams.input_marks import unapplied

from tailguard import catalogue as cat

__all__ = [
    "CAPACITY_INTERNAL",
    "CAPACITY_TABLE",
    "SCHEMA",
    "CapacityPlane",
    "CapacityTuning",
    "register_capacity",
]

SCHEMA = "tailguard.capacity.v1"
#: Internal: validated inference events re-keyed by deployment (service|model).
CAPACITY_INTERNAL = "tailguard.internal.capacity"
#: RocksDB table (changelogged) with every deployment's state (module docstring).
CAPACITY_TABLE = "tailguard-capacity"
#: Holds published (besides scale_up/scale_down): a wanted action that a guard blocked.
_BLOCKED = {"weights_resident", "cooldown"}


@dataclass(slots=True)
class CapacityStats:
    rows: int = 0
    published: int = 0
    late: int = 0
    #: Messages at or below a deployment's stored offset (applied before a crash).
    replayed: int = 0
    #: Rows whose input position a deployment had applied (forwarded again after a crash).
    replayed_rows: int = 0
    corrupt_states: int = 0
    #: A deployment's rows of one message that raised while applied (a bug: logged,
    #: skipped, so that one message cannot stop the agent for every deployment).
    failed_groups: int = 0


@dataclass(slots=True)
class CapacityPlane:
    """What :func:`register_capacity` returns: the ingest hooks and the counters."""

    forward: Any
    stats: CapacityStats
    deployments: dict[str, Deployment]
    agent: Any = None
    table: Any = None


def _event_id(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:32]


def _direction(change: dict[str, Any]) -> str:
    """How a RAG similarity threshold moved."""
    previous = change["previous"]
    if previous is None:
        return "initial"
    return "lowered" if change["threshold"] < previous else "raised"


def register_capacity(
    app: faust.App,
    settings: Settings,
    *,
    outputs: Outputs,
    writer: BulkWriter | None = None,
    gpu_cache: Any = None,
    admin: Any = None,
    tuning: CapacityTuning | None = None,
    stats: WorkerStats | None = None,
) -> CapacityPlane:
    """Declare the internal topic and attach the capacity agent (``stats``: the
    worker's counters, which count the requests applied in place and forwarded)."""
    import os

    tune = tuning or CapacityTuning.from_json(os.environ.get("TAILGUARD_CAPACITY", ""))
    writer = writer or BulkWriter(outputs)
    internal_name = settings.topic_prefix + CAPACITY_INTERNAL
    internal = internal_topic(app, settings, internal_name)
    precreate_topics(settings, [internal_name], [CAPACITY_TABLE])
    table = app.Table(
        CAPACITY_TABLE,
        default=None,
        partitions=settings.partitions,
        key_type=bytes,
        value_type=bytes,
        options=settings.rocksdb_options(),
        help="capacity state per deployment: knee, scaling episode, breakers, RAG thresholds",
    )
    out_topic = settings.topic_prefix + cat.CAPACITY
    cstats = CapacityStats()
    stats = stats if stats is not None else WorkerStats()

    def corrupt(key: bytes, exc: CorruptStateError) -> None:
        cstats.corrupt_states += 1
        app.log.error("tailguard: capacity state %r discarded: %s", key, exc)

    store = CapacityStore(table, tune, settings.partitions, corrupt)
    deployments = store.deployments
    #: Partitions of the internal topic (and table) assigned here and not revoked
    #: since: the ingest applies its requests of their deployments in place.
    local: set[int] = set()
    #: One deployment's state is applied and stored by one coroutine at a time
    #: (the ingest's in-place path and the agent both await deliveries).
    busy = asyncio.Lock()

    async def delivered(what: str) -> None:
        """Wait until everything queued so far is delivered (the broker may be away)."""
        while True:
            try:
                await outputs.flush(timeout_s=30.0)
                break
            except OutputError as exc:
                app.log.warning("tailguard: capacity %s not delivered yet: %s", what, exc)
                await asyncio.sleep(1.0)
        writer.delivered()

    async def store_applied(
        applied: dict[int, list[tuple[Deployment, Group | None]]],
        published: int,
        *,
        deliver: bool,
    ) -> list[Group]:
        """Records out before the state that produced them is written (a crash
        re-sends a record with the same event_id; it never loses one), then the
        state of each partition, delivered before the input it holds is
        acknowledged: here when ``deliver``, else by the ingest (its checkpoint's
        flush, or the one before it acknowledges input it did not fold). Returns
        the groups of the partitions revoked meanwhile, whose state is not
        written: their next owner may be reading it."""
        if cstats.published > published:
            await delivered("records")
        moved: list[Group] = []
        for partition, deps in applied.items():
            if partition not in local:
                moved += [group for _, group in deps if group is not None]
                continue
            writes = Writes()
            for dep, _ in deps:
                store.save(dep, writes)
            writer.write(table, partition, writes.puts, writes.deletes)
        if deliver:
            await delivered("state")
        return moved

    async def send(groups: list[Group]) -> None:
        """Forward ``groups`` to the owners of their partitions."""
        by_partition: dict[int, list[Group]] = {}
        for group in groups:
            partition = partition_of(f"{group[0]}|{group[1]}", settings.partitions)
            by_partition.setdefault(partition, []).append(group)
        for partition, away in by_partition.items():
            stats.capacity_forwarded += sum(len(rows) for _, _, rows, _ in away)
            for value in messages(away, MAX_ROWS, MAX_BYTES):
                await internal.send(key=f"p{partition}".encode(), value=value, partition=partition)

    async def apply_in_place(groups: list[Group]) -> None:
        """The requests of deployments whose partition is here: applied at once, no hop.

        Each row is applied once by its input position (the core's marks), as
        rows that come through the internal topic are; the internal offset in the
        core is left as it is. A partition revoked before its state was written
        gets its rows through the topic after all: their input may stay here,
        acknowledged at the next checkpoint, and its next owner applies them to
        the state it has (the records they produced may then go out twice, with
        the same event ids)."""
        async with busy:
            published = cstats.published
            applied: dict[int, list[tuple[Deployment, Group | None]]] = {}
            for group in groups:
                service, model, rows, runs = group
                dep = store.load(service, model)
                fresh = rows.take(unapplied(dep.core.applied, runs, len(rows)))
                cstats.replayed_rows += len(rows) - len(fresh)
                cstats.rows += len(fresh)
                stats.capacity_in_place += len(fresh)
                absorb_guarded(dep, fresh, "in place")
                applied.setdefault(store.partition(f"{service}|{model}"), []).append((dep, group))
            moved = await store_applied(applied, published, deliver=False)
        await send(moved)

    async def forward(groups: list[Group]) -> None:
        """Each deployment's requests of one ingest batch (and their input positions):
        applied here when its partition is, else forwarded to the partition's owner."""
        in_place = settings.capacity_in_place and writer.can_write(table)
        here: list[Group] = []
        away: list[Group] = []
        for group in groups:
            mine = in_place and store.partition(f"{group[0]}|{group[1]}") in local
            (here if mine else away).append(group)
        await send(away)
        if here:
            await apply_in_place(here)

    def gpu_state(dep: Deployment) -> tuple[float | None, float | None, dict[str, Any]]:
        """Mean GPU utilisation and the highest memory fraction of the deployment's GPUs."""
        utils: list[float] = []
        mems: list[float] = []
        for host, gpu in sorted(dep.core.gpus):
            raw = gpu_cache.get(f"{host}:{gpu}".encode()) if gpu_cache is not None else None
            if raw is None:
                continue
            try:
                s = json.loads(raw)
            except ValueError:
                continue
            if s.get("util_gpu_pct") is not None:
                utils.append(float(s["util_gpu_pct"]))
            if s.get("mem_used_mib") is not None and s.get("mem_total_mib"):
                mems.append(float(s["mem_used_mib"]) / float(s["mem_total_mib"]))
        util = round(sum(utils) / len(utils), 3) if utils else None
        mem = max(mems) if mems else None
        return (
            util,
            mem,
            {"gpus": [f"{h}:{g}" for h, g in sorted(dep.core.gpus)], "gpus_sampled": len(utils)},
        )

    def publish(
        dep: Deployment,
        kind: str,
        decision: str,
        ts_ms: int,
        evidence: dict[str, Any],
        *,
        subject: str = "",
        reason: str = "",
        extra: dict[str, Any] | None = None,
    ) -> None:
        key = f"{dep.service}|{dep.model}"
        eid = _event_id(kind, key, subject, ts_ms, decision)
        payload: dict[str, Any] = {
            "schema": SCHEMA,
            "event_id": eid,
            "ts_ms": ts_ms,
            "kind": kind,
            "decision": decision,
            "reason": reason,
            "deployment": {"service": dep.service, "model": dep.model},
            "expert": None,
            "index": None,
            "instance": None,
            "evidence": evidence,
        }
        payload.update(extra or {})
        value, headers = frame(payload, source=settings.source)
        outputs.send(out_topic, key.encode(), value, headers)
        cstats.published += 1
        if admin is not None:
            admin.audit_decision(
                f"capacity.{kind}",
                {"deployment": payload["deployment"], "subject": subject, "evidence": evidence},
                decision,
                seed=eid,
                summary=reason,
                key=key,
            )

    def on_scale(dep: Deployment, d: Decision, ts_ms: int, gpu_ev: dict[str, Any]) -> None:
        core = dep.core
        if d.actionable:
            core.last_hold = None
            publish(dep, "scale", d.decision, ts_ms, {**d.evidence, **gpu_ev}, reason=d.reason)
            return
        if d.reason in _BLOCKED and d.reason != core.last_hold:
            publish(dep, "scale", HOLD, ts_ms, {**d.evidence, **gpu_ev}, reason=d.reason)
        core.last_hold = d.reason if d.reason in _BLOCKED else None

    def absorb(dep: Deployment, rows: CapacityRows) -> None:
        before = dep.core.load.late
        for effect in apply_rows(dep, rows, gpu_state, store.rag_tracker):
            match effect:
                case Warmup(ts, instance, report):
                    verdict = "effective" if report.effective else "ineffective"
                    extra = {"instance": instance}
                    evidence = report.evidence()
                    publish(dep, "warmup", verdict, ts, evidence, subject=instance, extra=extra)
                case Breaker(ts, t, evidence):
                    extra = {"expert": t.expert}
                    subject = str(t.expert)
                    publish(dep, "breaker", t.after, ts, evidence, subject=subject, extra=extra)
                case RagChange(ts, index, change):
                    publish(
                        dep,
                        "rag_threshold",
                        _direction(change),
                        ts,
                        change,
                        subject=index,
                        extra={"index": index},
                    )
                case Interval(closed, knee, decision, gpu_ev):
                    if knee is not None:
                        publish(dep, "knee", "updated", closed.end_ms, knee.evidence())
                    on_scale(dep, decision, closed.end_ms, gpu_ev)
        cstats.late += dep.core.load.late - before

    def absorb_guarded(dep: Deployment, rows: CapacityRows, where: str) -> None:
        try:
            absorb(dep, rows)
        except Exception as exc:  # a poison message must not stop every deployment
            cstats.failed_groups += 1
            app.log.error(
                "tailguard: capacity rows of %s|%s not applied (%s): %s: %s",
                dep.service,
                dep.model,
                where,
                type(exc).__name__,
                exc,
            )

    @app.agent(internal, name="tailguard.capacity")
    async def capacity(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            try:
                groups = decode_message(event.value, event.key)
            except msgspec.DecodeError as exc:  # written by our own forwarder: a bug
                key = event.key or b""
                app.log.error("tailguard: undecodable capacity rows on %r: %s", key, exc)
                continue
            offset = event.message.offset
            async with busy:
                published = cstats.published
                applied: list[tuple[Deployment, Group | None]] = []
                for service, model, rows, runs in groups:
                    dep = store.load(service, model)
                    if offset <= dep.core.offset:  # applied before a crash (per deployment)
                        cstats.replayed += 1
                        continue
                    # Rows the ingest forwards again after a crash (its input is
                    # acknowledged at checkpoints): applied once, by input position.
                    fresh = rows.take(unapplied(dep.core.applied, runs, len(rows)))
                    cstats.replayed_rows += len(rows) - len(fresh)
                    cstats.rows += len(fresh)
                    absorb_guarded(dep, fresh, f"offset {offset}")
                    dep.core.offset = offset
                    applied.append((dep, None))
                # Stored and delivered before faust acknowledges the message (when
                # the stream asks for the next one); a message of a partition revoked
                # meanwhile is not stored: its next owner reads it again.
                await store_applied({event.message.partition: applied}, published, deliver=True)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: Any, revoked: set[TP], **kwargs: Any) -> None:
        local.difference_update(tp.partition for tp in revoked if tp.topic == internal_name)
        # State queued for a partition that may move: on the changelog before its
        # next owner reads it (faust flushes only its own producer here).
        try:
            await outputs.flush(timeout_s=10.0)
            writer.delivered()
        except OutputError as exc:
            app.log.warning("tailguard: capacity state not delivered at a rebalance: %s", exc)

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        # Deployments are read from the table again: another worker may have moved them on.
        deployments.clear()
        local.clear()
        local.update(tp.partition for tp in assigned if tp.topic == internal_name)

    return CapacityPlane(forward, cstats, deployments, capacity, table)
