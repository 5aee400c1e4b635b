"""The admin plane: signed commands on ``tailguard.admin``, one reply each, an audit trail.

::

    tailguard admin … ──▶ tailguard.admin (1 partition) ──▶ admin agent (the worker owning it)
                                                              │ gate: parse, signature, freshness
                                                              │ seen table (RocksDB): replays
                                                              │ registry: action → role, handler
                 ┌────────────────────────────────────────────┤
                 │ state changes                              │ queries of a series' live state
                 ▼                                            ▼
    tailguard.internal.control (compacted)        tailguard.internal.admin (partitioned like the
      read by every worker: SLOs, silences,         series topic) ──▶ the worker owning the series
      acks, key retirements                         answers (series snapshot)
                 │                                            │
                 └──────────────▶ tailguard.admin.replies ◀───┘  exactly one reply per command
                                  tailguard.audit                one audit record per command
                                                                 + every breach decision

Why this shape:

- **Replay protection survives restarts and works with several workers**:
  ``tailguard.admin`` has one partition, so one worker at a time judges
  commands, in order; the ids it has seen live in a RocksDB table
  (``tailguard-admin-seen``, changelogged) that moves with the partition.
  Entries older than the 5-minute horizon are pruned (a copy would be stale).
- **Worker-wide state reaches every worker**: the admin agent writes state,
  not commands, to a compacted control topic that every worker applies
  (:mod:`tailguard.agents.control`); it replies only after its own worker
  applied the record, so a following command sees it. ``slo set`` therefore
  changes the next evaluation of a series on whichever worker owns it.
- **Series state is answered by its owner**: a series' windows live in the
  memory of the worker owning its partition. ``series.snapshot`` is forwarded
  to that partition of an internal topic co-partitioned with
  ``tailguard.internal.series`` (faust assigns equal partition numbers of
  topics with equal partition counts to the same worker); the owner replies.
  The admin agent does not reply to a forwarded command, so there is still
  exactly one reply.
- **A bad command never stops a worker**: every failure — gate refusal,
  ``CommandError``, any exception of a handler — becomes a refusal reply and an
  audit record; the agent loop itself only logs what it cannot even reply to
  (the broker being away).

Delivery is at least once with deterministic ids: a command re-delivered
after a crash (same admin offset) is run again and its reply and audit record
carry the same ``event_id``; handlers are idempotent per ``command_id``.

Trust boundary: ``tailguard.admin`` is writable by operators; the internal
topics (control, admin queries, changelogs) must be writable by the workers
only (Kafka ACLs) — whoever can write them can change worker state anyway.

Other modules register actions on ``pipeline.admin.registry`` (see
:mod:`tailguard.admin.registry`) and audit their automatic decisions with
:meth:`AdminPlane.audit_decision`.
"""

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import faust
import msgspec
from tailguard.agents.breaches import BreachEngine
from tailguard.agents.control import BreachView, ControlFollower, ControlState, SloBook
from tailguard.agents.outputs import Outputs
from tailguard.agents.settings import Settings
from tailguard.agents.state import SeriesStore, bucket_key
from tailguard.agents.topics import internal_topic
from tailguard.schemas import AdminCommand, ce_headers
from tailguard.streams import RingConfig, SeriesWindows

from tailguard import catalogue as cat
from tailguard.admin.errors import CommandError, KeyFileError
from tailguard.admin.gate import (
    Envelope,
    Refusal,
    ReplayWindow,
    SeenEntry,
    Verified,
    authenticate,
    authorise,
    replay_check,
)
from tailguard.admin.keys import Keyring, load_keyring
from tailguard.admin.records import audit_payload, decision_payload, reply_payload
from tailguard.admin.registry import ActionRegistry, Call, register_experiment_stubs

__all__ = ["QUERIES", "AdminPlane", "AdminProducer", "register_admin"]

log = logging.getLogger("tailguard.admin")

#: Internal: commands forwarded to the worker owning a partition (co-partitioned
#: with ``tailguard.internal.series``); faust declares it with the worker's
#: partition count.
QUERIES = "tailguard.internal.admin"
_PRUNE_EVERY_MS = 30_000


def _now_ms() -> int:
    return int(time.time() * 1000)


def _json(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=str).encode()


class AdminProducer:
    """The admin plane's producer (librdkafka): awaited sends, with their offsets.

    Separate from the SLI agent's :class:`~tailguard.agents.outputs.Outputs`
    so a reply never waits behind a minute's worth of snapshots.
    """

    def __init__(self, broker: str) -> None:
        from confluent_kafka import Producer

        self._producer = Producer(
            {
                "bootstrap.servers": broker,
                "linger.ms": 2,
                "enable.idempotence": True,
                "message.timeout.ms": 30_000,
                "log_level": 3,
            }
        )
        self._lock = threading.Lock()

    def produce_nowait(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        self._producer.produce(topic, value=value, key=key, headers=headers or [])
        self._producer.poll(0)

    async def send(
        self,
        records: list[tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]],
        *,
        partition: int | None = None,
        timeout_s: float = 35.0,
    ) -> list[int]:
        """Send ``(topic, key, value, headers)`` records; their offsets once all are delivered."""
        results: list[tuple[Any, Any] | None] = [None] * len(records)

        def report(i: int) -> Any:
            def cb(err: Any, msg: Any) -> None:
                results[i] = (err, msg)

            return cb

        for i, (topic, key, value, headers) in enumerate(records):
            kwargs: dict[str, Any] = {"on_delivery": report(i), "headers": headers}
            if partition is not None:
                kwargs["partition"] = partition
            self._producer.produce(topic, value=value, key=key, **kwargs)
        deadline = time.monotonic() + timeout_s
        self._producer.poll(0)
        while any(r is None for r in results):
            if time.monotonic() > deadline:
                msg = f"admin records not delivered within {timeout_s:.0f} s (broker away?)"
                raise TimeoutError(msg)
            await asyncio.sleep(0.002)
            self._producer.poll(0)
        failed = [str(r[0]) for r in results if r is not None and r[0] is not None]
        if failed:
            msg = f"admin records not delivered: {failed[:3]}"
            raise RuntimeError(msg)
        return [r[1].offset() for r in results if r is not None]

    def close(self) -> None:
        self._producer.flush(10)


@dataclass
class AdminPlane:
    """The admin plane of one worker (see the module docstring)."""

    app: faust.App
    settings: Settings
    book: SloBook
    engine: BreachEngine
    store: SeriesStore
    tables: Any
    outputs: Outputs
    registry: ActionRegistry = field(default_factory=ActionRegistry)
    window: ReplayWindow = field(default_factory=ReplayWindow)
    keyring: Keyring = field(default_factory=Keyring)
    view: BreachView = field(default_factory=BreachView)
    seen: Any = None
    pid: int = field(default_factory=os.getpid)

    def __post_init__(self) -> None:
        prefix = self.settings.topic_prefix
        self.admin_topic = prefix + cat.ADMIN
        self.replies_topic = prefix + cat.ADMIN_REPLIES
        self.audit_topic = prefix + cat.AUDIT
        self.control_topic = prefix + cat.CONTROL
        self.queries_topic = prefix + QUERIES
        self.worker = f"{self.settings.source}/{self.pid}"
        self.state = ControlState(
            self.book,
            on_slos=self._slos_changed,
            on_key=self._key_retired,
            on_reload=self.reload_keys,
        )
        self.follower = ControlFollower(
            self.settings.broker,
            self.control_topic,
            prefix + cat.BREACHES,
            self.state,
            self.view,
        )
        self.producer: AdminProducer | None = None
        self._last_prune_ms = 0
        self.commands = 0
        self.refused = 0

    # -- lifecycle (called by the worker around faust's run)

    def start(self) -> None:
        if self.settings.admin_keys_file is not None:
            try:
                self.keyring = self.keyring.with_keys_of(
                    load_keyring(self.settings.admin_keys_file)
                )
            except KeyFileError as exc:
                log.error("tailguard: admin keys not loaded, every command is refused: %s", exc)
        self.producer = AdminProducer(self.settings.broker)
        self.follower.start()

    def stop(self) -> None:
        self.follower.stop()
        if self.producer is not None:
            self.producer.close()

    # -- control state hooks (run on the event loop, or before faust starts)

    def _slos_changed(self) -> None:
        self.engine.slo_version = self.book.version
        for key, cached in self.store.items():
            cached.state.thresholds = self.book.thresholds(key)

    def _key_retired(self, key_id: str, at_ms: int | None) -> None:
        self.keyring.retire(key_id, at_ms)

    def reload_keys(self) -> None:
        """Re-read the keys file (``keys/reload``); a bad file keeps the current keys."""
        if self.settings.admin_keys_file is None:
            return
        try:
            fresh = load_keyring(self.settings.admin_keys_file)
        except KeyFileError as exc:
            log.error("tailguard: admin keys file not reloaded, keeping the old keys: %s", exc)
            return
        self.keyring = self.keyring.with_keys_of(fresh)
        for key_id, value in self.state.keys.items():
            retired = value.get("retired_ms")
            self.keyring.retire(key_id, None if retired is None else int(retired))

    # -- publishing

    def _producer(self) -> AdminProducer:
        if self.producer is None:  # agents started without start(): e.g. a test app
            self.producer = AdminProducer(self.settings.broker)
        return self.producer

    async def publish(self, key: str, value: Mapping[str, Any] | None) -> int:
        """Write a control record; returns its offset once this worker applied it."""
        data = None if value is None else _json(value)
        (offset,) = await self._producer().send([(self.control_topic, key.encode(), data, [])])
        if not await self.follower.wait_applied(offset):
            log.warning(
                "tailguard: control record %s (offset %d) not applied here yet", key, offset
            )
        return offset

    def _framed(self, topic: str, key: bytes | None, payload: dict[str, Any]) -> Any:
        headers = ce_headers(
            payload["schema"], payload["event_id"], payload["ts_ms"], source=self.settings.source
        )
        return (topic, key, _json(payload), headers)

    async def finish(
        self,
        envelope: Envelope,
        origin: Mapping[str, Any],
        *,
        refusal: Refusal | None = None,
        result: Mapping[str, Any] | None = None,
        verified: Verified | None = None,
        failed: bool = False,
    ) -> None:
        """Write the one reply and the one audit record of a command."""
        now = _now_ms()
        reply = reply_payload(
            envelope, origin, now_ms=now, worker=self.worker, refusal=refusal, result=result
        )
        audit = audit_payload(
            envelope,
            origin,
            now_ms=now,
            worker=self.worker,
            authenticated=verified is not None,
            role=verified.key.role.name if verified is not None else None,
            refusal=refusal,
            failed=failed,
        )
        key = (envelope.command_id or "").encode() or None
        actor = (envelope.actor or "unknown").encode()
        await self._producer().send(
            [
                self._framed(self.replies_topic, key, reply),
                self._framed(self.audit_topic, actor, audit),
            ]
        )
        self.commands += 1
        if refusal is not None:
            self.refused += 1
            log.info(
                "tailguard: admin command %s (%s) refused: %s",
                envelope.command_id,
                envelope.action,
                refusal.code,
            )

    # -- the admin agent

    async def on_command(self, raw: bytes | None, origin: dict[str, Any]) -> None:
        """Judge and run one admin message; always ends with exactly one reply (or a forward)."""
        envelope = Envelope()
        verified: Verified | None = None
        try:
            now = _now_ms()
            envelope, verdict = authenticate(raw, self.keyring, now, self.window)
            if isinstance(verdict, Refusal) and verdict.code in ("stale", "future"):
                # A re-delivery (same offset) of a command accepted when it was fresh.
                held = self._seen_entry(envelope.command_id)
                if held is not None and (held.partition, held.offset) == (
                    origin["partition"],
                    origin["offset"],
                ):
                    envelope, verdict = authenticate(
                        raw, self.keyring, now, ReplayWindow(2**62, 2**62)
                    )
            if isinstance(verdict, Refusal):
                await self.finish(envelope, origin, refusal=verdict)
                return
            verified = verdict
            command = verified.command
            replay = replay_check(
                self._seen_entry(command.command_id),
                command.command_id,
                origin["partition"],
                origin["offset"],
            )
            if replay is not None:
                await self.finish(envelope, origin, refusal=replay, verified=verified)
                return
            self._remember(command.command_id, command.ts_ms, origin, now)
            action = self.registry.get(command.action)
            if action is None:
                refusal = Refusal(
                    "unknown_action",
                    f"no action {command.action!r}; known: {', '.join(self.registry.names())}",
                )
                await self.finish(envelope, origin, refusal=refusal, verified=verified)
                return
            denied = authorise(verified, command.action, action.role)
            if denied is not None:
                await self.finish(envelope, origin, refusal=denied, verified=verified)
                return
            if action.route is not None:
                partition = action.route(dict(command.args))
                if not 0 <= partition < self.settings.partitions:
                    msg = f"route of {action.name} gave partition {partition}"
                    raise RuntimeError(msg)
                await self._forward(verified, origin, partition)
                return
            result = await action.handler(self._call(verified, now))
            await self.finish(envelope, origin, result=result, verified=verified)
            await self._prune(now)
        except CommandError as exc:
            await self.finish(
                envelope, origin, refusal=Refusal(exc.code, exc.message), verified=verified
            )
        except Exception as exc:  # any handler bug: a "failed" reply, never a dead worker
            log.exception("tailguard: admin command %s failed", envelope.command_id)
            refusal = Refusal("failed", f"the worker failed: {type(exc).__name__}: {exc}")
            await self.finish(envelope, origin, refusal=refusal, verified=verified, failed=True)

    def _seen_entry(self, command_id: str | None) -> SeenEntry | None:
        if not command_id or self.seen is None:
            return None
        raw = self.seen.get(command_id.encode())
        return None if raw is None else SeenEntry.from_bytes(raw)

    def _remember(self, command_id: str, ts_ms: int, origin: Mapping[str, Any], now: int) -> None:
        if self.seen is None:
            return
        entry = SeenEntry(ts_ms, int(origin["partition"]), int(origin["offset"]))
        self.seen[command_id.encode()] = entry.to_bytes()
        if now - self._last_prune_ms < _PRUNE_EVERY_MS:
            return
        self._last_prune_ms = now
        gone = [
            key
            for key, raw in list(self.seen.items())
            if self.window.forgettable(SeenEntry.from_bytes(raw).ts_ms, now)
        ]
        for key in gone:
            del self.seen[key]

    async def _prune(self, now: int) -> None:
        """Delete expired silences from the control topic (they are ignored anyway)."""
        for silence in list(self.state.silences.values()):
            if silence.ends_ms <= now - 60_000:
                await self.publish(f"silence/{silence.silence_id}", None)

    def _call(self, verified: Verified, now: int, partition: int | None = None) -> Call:
        command = verified.command
        return Call(
            command_id=command.command_id,
            action=command.action,
            actor=command.actor,
            key_id=verified.key.key_id,
            role=verified.key.role,
            args=dict(command.args),
            ts_ms=command.ts_ms,
            now_ms=now,
            partition=partition,
            worker=self,
            publisher=self.publish,
        )

    async def _forward(self, verified: Verified, origin: Mapping[str, Any], partition: int) -> None:
        body = {
            "command": verified.document,
            "key_id": verified.key.key_id,
            "role": verified.key.role.name,
            "origin": dict(origin),
        }
        await self._producer().send(
            [(self.queries_topic, verified.command.command_id.encode(), _json(body), [])],
            partition=partition,
        )

    # -- the query agent (forwarded commands, on the owner of their partition)

    async def on_forwarded(self, raw: bytes | None, partition: int) -> None:
        envelope = Envelope()
        origin: dict[str, Any] = {"topic": self.admin_topic, "partition": 0, "offset": -1}
        verified: Verified | None = None
        try:
            body = json.loads(raw or b"null")
            doc = body["command"]
            origin = dict(body["origin"])
            command = msgspec.convert(doc, AdminCommand)
            key = self.keyring.get(body["key_id"])
            if key is None:  # the keys file differs from the admin worker's
                raise CommandError(
                    "unknown_key",
                    f"key {body['key_id']!r} is not in the keys file of the worker owning the "
                    "series; keep every worker's keys file the same",
                )
            envelope = Envelope(
                command.command_id,
                command.ts_ms,
                command.actor,
                command.key_id,
                command.action,
                dict(command.args),
            )
            verified = Verified(command, doc, key)
            action = self.registry.get(command.action)
            if action is None:
                raise CommandError("unknown_action", f"no action {command.action!r} here")
            result = await action.handler(self._call(verified, _now_ms(), partition))
            await self.finish(envelope, origin, result=result, verified=verified)
        except CommandError as exc:
            await self.finish(
                envelope, origin, refusal=Refusal(exc.code, exc.message), verified=verified
            )
        except Exception as exc:  # as in on_command: reply "failed", go on
            log.exception("tailguard: forwarded admin command failed")
            refusal = Refusal("failed", f"the worker failed: {type(exc).__name__}: {exc}")
            await self.finish(envelope, origin, refusal=refusal, verified=verified, failed=True)

    # -- breach decisions: silences, acks, audit (called inside the SLI agent)

    def on_breach(self, payload: dict[str, Any]) -> None:
        """Mark a breach record silenced / acknowledged and audit the decision."""
        now = _now_ms()
        silence = next((s for s in self.state.active_silences(now) if s.matches(payload)), None)
        payload["silenced"] = silence is not None
        payload["silence_id"] = silence.silence_id if silence is not None else None
        ack = self.state.acks.get(payload.get("breach_id", ""))
        payload["acked"] = (
            None
            if ack is None
            else {"by": ack.get("by"), "at_ms": ack.get("at_ms"), "note": ack.get("note")}
        )
        series = payload.get("series") or {}
        self.audit_decision(
            f"breach.{payload.get('state')}",
            {
                "breach_id": payload.get("breach_id"),
                "kind": payload.get("kind"),
                "slo": payload.get("slo"),
                "severity": payload.get("severity"),
                "series": series,
                "at_ms": payload.get("at_ms"),
                "seq": payload.get("seq"),
                "burn_rates": payload.get("burn_rates"),
                "silenced": payload["silenced"],
                "silence_id": payload["silence_id"],
            },
            str(payload.get("state")),
            seed=str(payload.get("event_id")),
            summary=str(payload.get("reason") or ""),
            key="|".join(str(series.get(k)) for k in ("service", "model", "variant", "tenant")),
        )
        if ack is not None and payload.get("state") == "resolved":
            # The breach is over: its ack goes (duplicates after a crash are harmless).
            try:
                self._producer().produce_nowait(
                    self.control_topic, f"ack/{payload['breach_id']}".encode(), None
                )
            except BufferError:
                log.warning("tailguard: ack of %s not cleared (queue full)", payload["breach_id"])

    def audit_decision(
        self,
        action: str,
        args: Mapping[str, Any],
        outcome: str,
        *,
        seed: str,
        summary: str = "",
        key: str = "tailguard",
    ) -> None:
        """Audit an automatic decision (queued on the SLI agent's output producer, which
        the agent flushes before it checkpoints). ``seed``: the decision's own event id."""
        payload = decision_payload(
            action, args, outcome, seed=seed, now_ms=_now_ms(), worker=self.worker, summary=summary
        )
        topic, k, value, headers = self._framed(self.audit_topic, key.encode(), payload)
        self.outputs.send(topic, k or b"", value, headers)

    # -- helpers for built-in actions

    def lookup_series(self, key: str) -> Any:
        """The live state of a series owned here (cache, else the tables), or None."""
        for held, cached in self.store.items():
            if held == key:
                return cached.state
        meta = self.tables.series_meta.get(key)
        if meta is None:
            return None
        return SeriesWindows.restore(
            meta,
            lambda record: self.tables.series_buckets.get(bucket_key(key, *record)),
            RingConfig(allowed_lateness_ms=self.settings.allowed_lateness_ms),
            self.book.thresholds(key),
        )


def register_admin(
    app: faust.App,
    settings: Settings,
    *,
    book: SloBook,
    engine: BreachEngine,
    store: SeriesStore,
    tables: Any,
    outputs: Outputs,
) -> AdminPlane:
    """Attach the admin and admin-query agents, the seen table and the control timer."""
    from tailguard.agents.admin_actions import register_builtin_actions

    plane = AdminPlane(
        app=app,
        settings=settings,
        book=book,
        engine=engine,
        store=store,
        tables=tables,
        outputs=outputs,
    )
    register_builtin_actions(plane.registry, settings)
    register_experiment_stubs(plane.registry)
    engine.on_payload = plane.on_breach
    plane.seen = app.Table(
        "tailguard-admin-seen",
        default=None,
        partitions=1,
        key_type=bytes,
        value_type=bytes,
        options=settings.rocksdb_options(),
        help="admin command ids seen in the last 5 minutes (replay protection)",
    )
    admin_topic = app.topic(
        plane.admin_topic, key_serializer="raw", value_serializer="raw", allow_empty=True
    )
    queries_topic = internal_topic(app, settings, plane.queries_topic)

    @app.agent(admin_topic, name="tailguard.admin")
    async def admin(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            msg = event.message
            origin = {"topic": msg.topic, "partition": msg.partition, "offset": msg.offset}
            try:
                await plane.on_command(event.value, origin)
            except Exception:  # not even a reply could be written (broker away): log, go on
                log.exception("tailguard: no reply written for admin message %s", origin)

    @app.agent(queries_topic, name="tailguard.admin.queries")
    async def queries(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            try:
                await plane.on_forwarded(event.value, event.message.partition)
            except Exception:  # as above
                log.exception("tailguard: no reply written for a forwarded admin command")

    @app.timer(0.2, name="tailguard.control.apply")
    async def apply_control() -> None:
        plane.follower.drain()

    @app.on_partitions_assigned.connect
    async def control_first(sender: Any, assigned: Any, **kwargs: Any) -> None:
        # Before the new partitions' events are folded: the latest SLOs, silences, keys.
        try:
            plane.follower.sync()
        except Exception:  # a rebalance hook must never crash the app
            log.exception("tailguard: control state not synced at assignment")

    return plane
