"""Capacity agent: throughput knee, scaling, warm-up, MoE expert breakers, RAG threshold.

::

    ingest (validated events) ──forward──▶ tailguard.internal.capacity ──▶ capacity agent
         (columns of the requests of each deployment service|model,        │
          one message per partition and batch)                             │
                                                                            ├─▶ tailguard.capacity
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

A message holds the requests of one ingest batch for the deployments of one
partition (a deployment always hashes to the same one), as columns per
deployment, at most 2,000 requests (the wire format:
:mod:`~tailguard.agents.capacity_columns`). Per message: each deployment in it
is read from the table once (then kept in memory until the next partition
assignment), its requests are applied
(:func:`~tailguard.agents.capacity_apply.apply_rows`), the
records they produced are flushed, then the state that changed is written —
experts, indexes and the knee (only when an interval closed) first, the core
(with the message's offset) last. A message at or below a deployment's stored
offset was applied to it already and is skipped for it; why each crash point
loses and invents nothing is in docs/capacity.md.

The ingest acknowledges its input at checkpoints, so after a crash it forwards
again the requests since the last one, in new internal messages. Every row
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
from tailguard.agents.capacity_tuning import CapacityTuning
from tailguard.agents.outputs import OutputError, Outputs
from tailguard.agents.publish import frame
from tailguard.agents.settings import Settings
from tailguard.agents.topics import internal_topic, precreate_topics
from tailguard.streams.capacity import HOLD, Decision
from tailguard.streams.capacity_state import (
    decode_core,
    decode_experts,
    decode_knee,
    decode_rag,
    encode_core,
    encode_experts,
    encode_knee,
    encode_rag,
    restore_segments,
    segment_changes,
)
from tailguard.streams.errors import CorruptStateError
from tailguard.streams.input_marks import unapplied
from tailguard.streams.rag import RagThreshold

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
_SEP = "\x1f"
#: Holds published (besides scale_up/scale_down): a wanted action that a guard blocked.
_BLOCKED = {"weights_resident", "cooldown"}


@dataclass(slots=True)
class CapacityStats:
    rows: int = 0
    published: int = 0
    late: int = 0
    #: Deployments whose state was read back from the table (restart, rebalance).
    restored: int = 0
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


def _segment_key(key: str, number: int) -> bytes:
    """Table key of segment ``number`` of deployment ``key`` (service|model)."""
    return f"O{_SEP}{key}{_SEP}{number}".encode()


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
    gpu_cache: Any = None,
    admin: Any = None,
    tuning: CapacityTuning | None = None,
) -> CapacityPlane:
    """Declare the internal topic and attach the capacity agent."""
    import os

    tune = tuning or CapacityTuning.from_json(os.environ.get("TAILGUARD_CAPACITY", ""))
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
    # Deployments read from the table since the last partition assignment.
    deployments: dict[str, Deployment] = {}

    def corrupt(key: bytes, exc: CorruptStateError) -> None:
        cstats.corrupt_states += 1
        app.log.error("tailguard: capacity state %r discarded: %s", key, exc)

    def segment(key: str, number: int) -> bytes:
        raw = table.get(_segment_key(key, number))
        if raw is None:
            msg = f"segment {number} of the open intervals is missing"
            raise CorruptStateError(msg)
        return raw  # type: ignore[no-any-return]

    def load(key: str, service: str, model: str) -> Deployment:
        """The deployment from memory, else from the table, else new."""
        dep = deployments.get(key)
        if dep is not None:
            return dep
        dep = Deployment.new(service, model, tune)
        ckey, ekey = f"C{_SEP}{key}".encode(), f"E{_SEP}{key}".encode()
        raw = table.get(ckey)
        if raw is not None:
            try:
                core = decode_core(
                    raw,
                    interval_ms=tune.interval_ms,
                    grace_ms=tune.grace_ms,
                    knee=tune.knee,
                    warmup_after=tune.warmup_after,
                )
                restore_segments(core, [segment(key, n) for n, _ in core.segments])
                dep.core = core
                cstats.restored += 1
            except CorruptStateError as exc:
                corrupt(ckey, exc)
        kkey = f"K{_SEP}{key}".encode()
        raw = table.get(kkey)
        if raw is not None:
            try:
                dep.core.knee = decode_knee(raw, tune.knee)
            except CorruptStateError as exc:
                corrupt(kkey, exc)
        elif dep.core.knee.samples:
            dep.knee_dirty = True  # a core written with its history (older workers): move it
        raw = table.get(ekey)
        if raw is not None:
            try:
                dep.experts = decode_experts(raw, tune.breaker)
            except CorruptStateError as exc:
                corrupt(ekey, exc)
        deployments[key] = dep
        return dep

    def rag_tracker(dep: Deployment, index: str) -> RagThreshold:
        tracker = dep.rag.get(index)
        if tracker is not None:
            return tracker
        rkey = f"R{_SEP}{dep.service}|{dep.model}{_SEP}{index}".encode()
        raw = table.get(rkey)
        tracker = None
        if raw is not None:
            try:
                tracker = decode_rag(raw, tune.rag)
            except CorruptStateError as exc:
                corrupt(rkey, exc)
        if tracker is None:
            tracker = RagThreshold(tune.rag)
        dep.rag[index] = tracker
        return tracker

    def save(dep: Deployment, offset: int) -> None:
        """Write what changed: the new values of the open intervals (a segment),
        breakers and indexes first, the core (with ``offset``) last, then delete
        the segments whose intervals have all closed."""
        key = f"{dep.service}|{dep.model}"
        segment, done = segment_changes(dep.core)
        if segment is not None:
            number, data = segment
            table[_segment_key(key, number)] = data
        if dep.experts_dirty:
            table[f"E{_SEP}{key}".encode()] = encode_experts(dep.experts)
            dep.experts_dirty = False
        for index in sorted(dep.rag_dirty):
            table[f"R{_SEP}{key}{_SEP}{index}".encode()] = encode_rag(dep.rag[index])
        dep.rag_dirty.clear()
        if dep.knee_dirty:
            table[f"K{_SEP}{key}".encode()] = encode_knee(dep.core.knee)
            dep.knee_dirty = False
        dep.core.offset = offset
        table[f"C{_SEP}{key}".encode()] = encode_core(dep.core, history=False)
        for number in done:
            # A crash before this leaves the segment behind, listed by no core.
            table.pop(_segment_key(key, number), None)

    async def forward(groups: list[Group]) -> None:
        """Forward each deployment's requests of one ingest batch (and their input positions)."""
        by_partition: dict[int, list[Group]] = {}
        for group in groups:
            partition = partition_of(f"{group[0]}|{group[1]}", settings.partitions)
            by_partition.setdefault(partition, []).append(group)
        for partition, groups in by_partition.items():
            for value in messages(groups, MAX_ROWS, MAX_BYTES):
                await internal.send(key=f"p{partition}".encode(), value=value, partition=partition)

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
        for effect in apply_rows(dep, rows, gpu_state, rag_tracker):
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
            published = cstats.published
            applied: list[Deployment] = []
            for service, model, rows, runs in groups:
                dep = load(f"{service}|{model}", service, model)
                if offset <= dep.core.offset:  # applied before a crash (per deployment)
                    cstats.replayed += 1
                    continue
                # Rows the ingest forwards again after a crash (its input is
                # acknowledged at checkpoints): applied once, by input position.
                fresh = rows.take(unapplied(dep.core.applied, runs, len(rows)))
                cstats.replayed_rows += len(rows) - len(fresh)
                cstats.rows += len(fresh)
                try:
                    absorb(dep, fresh)
                except Exception as exc:  # a poison message must not stop every deployment
                    cstats.failed_groups += 1
                    app.log.error(
                        "tailguard: capacity rows of %s|%s not applied (offset %d): %s: %s",
                        service,
                        model,
                        offset,
                        type(exc).__name__,
                        exc,
                    )
                applied.append(dep)
            # Records out before the state that produced them is written (a crash
            # re-sends a record with the same event_id; it never loses one).
            while cstats.published > published:
                try:
                    await outputs.flush(timeout_s=30.0)
                    break
                except OutputError as exc:
                    app.log.warning("tailguard: capacity records not delivered yet: %s", exc)
                    await asyncio.sleep(1.0)
            for dep in applied:
                save(dep, offset)

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        # Deployments are read from the table again: another worker may have moved them on.
        deployments.clear()

    return CapacityPlane(forward, cstats, deployments, capacity, table)
