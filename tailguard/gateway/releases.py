"""Closing the loop: the gateway follows ``tailguard.releases`` and routes by it.

::

    tailguard.releases ──(thread: assign all partitions from the beginning)──▶ apply_decision
                                                                                 │ changed?
        state file (JSON, fsync + rename) ◀── save ────────────────────────────────┤
        router swap (an atomic reference assignment; handlers read the new one) ◀──┤
        tailguard.audit (what the gateway did, event_id from gateway + decision) ◀─┘

**Where the decisions come from at start — both, in this order:** the state
file (the last decision per experiment, so a gateway that restarts while the
broker is away still routes as before), then the whole ``tailguard.releases``
topic from the beginning (compacted and keyed by experiment, so it is short),
so decisions taken while the gateway was down are applied too. A decision is
applied only when its ``(generation, seq)`` is newer than the one held, so
re-reading the topic changes nothing and audits nothing twice.

What a decision does (:class:`~tailguard.gateway.routing.Override`): a
``rollback`` sends the rolled-back arm (every treatment when it names none) to
the control and stays until the experiment's next generation; a ``promote``
sends every arm to the promoted one; ``hold`` and ``continue`` change nothing,
except that one of a *newer generation* (the experiment was re-created) lifts
a previous generation's rollback or promote.
"""

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from tailguard.gateway.routing import ExperimentRoute, Override
from tailguard.schemas import ce_headers
from tailguard.schemas.release import ReleaseDecision

__all__ = ["DecisionStore", "ReleaseFollower", "apply_decision", "audit_record"]

log = logging.getLogger(__name__)

_decode_release = msgspec.json.Decoder(ReleaseDecision).decode
_ROUTING = ("rollback", "promote")


def apply_decision(
    current: Override | None, decision: ReleaseDecision, now_ms: int
) -> tuple[Override | None, str | None]:
    """The override after ``decision`` and what changed: ``rollback``, ``promote``,
    ``reset`` (a newer generation lifted a rollback/promote) or None."""
    new = Override(
        decision.experiment,
        decision.decision,
        decision.arm,
        decision.generation,
        decision.seq,
        decision.event_id,
        now_ms,
    )
    if current is not None and not new.newer_than(current):
        return current, None  # a duplicate or an older decision: re-read, not news
    if decision.decision in _ROUTING:
        return new, decision.decision
    if current is not None and current.decision in _ROUTING:
        if decision.generation > current.generation:
            return new, "reset"
        return current, None  # the guard decides once per generation
    return new, None


def audit_record(
    override: Override,
    change: str,
    experiment: ExperimentRoute | None,
    *,
    instance: str,
    source: str,
    now_ms: int,
) -> dict[str, Any]:
    """The ``tailguard.audit.v1`` record of a routing change (kind ``decision``)."""
    from tailguard.admin.records import decision_payload

    routes: dict[str, str] = {}
    if experiment is not None:
        routes = {a.name: override.served(experiment, a.name) for a in experiment.arms}
    moved = sorted(arm for arm, served in routes.items() if served != arm)
    summary = f"gateway {instance}: {change} of {override.experiment}: " + (
        ", ".join(f"{arm} → {routes[arm]}" for arm in moved) or "every arm serves itself"
    )
    return decision_payload(
        "gateway.route",
        {
            "experiment": override.experiment,
            "decision": override.decision,
            "arm": override.arm,
            "generation": override.generation,
            "seq": override.seq,
            "release_event_id": override.event_id,
            "routes": routes,
            "gateway": instance,
        },
        f"applied:{change}",
        seed=f"gateway|{instance}|{override.event_id}",
        now_ms=now_ms,
        worker=source,
        summary=summary,
        actor="tailguard-gateway",
    )


class DecisionStore:
    """The last decision per experiment, in a small JSON file (atomic replace + fsync)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, Override]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.error("tailguard gateway: state file %s unreadable, ignored: %s", self.path, exc)
            return {}
        out: dict[str, Override] = {}
        for exp, item in (raw.get("overrides") or {}).items():
            try:
                out[exp] = Override(**item)
            except TypeError as exc:
                log.error("tailguard gateway: bad entry %s in %s ignored: %s", exp, self.path, exc)
        return out

    def save(self, overrides: Mapping[str, Override]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        data = {"version": 1, "overrides": {k: asdict(v) for k, v in sorted(overrides.items())}}
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


class ReleaseFollower:
    """A thread that reads ``releases_topic`` from the beginning and applies decisions."""

    def __init__(
        self,
        broker: str,
        releases_topic: str,
        audit_topic: str,
        *,
        store: DecisionStore,
        overrides: Mapping[str, Override],
        experiments: Callable[[], Mapping[str, ExperimentRoute]],
        on_change: Callable[[dict[str, Override]], None],
        instance: str,
        source: str,
        producer: Any = None,
    ) -> None:
        self.broker = broker
        self.releases_topic = releases_topic
        self.audit_topic = audit_topic
        self.store = store
        self.overrides = dict(overrides)
        self._experiments = experiments
        self._on_change = on_change
        self.instance = instance
        self.source = source
        self.applied = 0
        self.seen = 0
        self.bad = 0
        self.audits_failed = 0
        self.assigned = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._producer = (
            producer
            if producer is not None
            else Producer(
                {
                    "bootstrap.servers": broker,
                    "linger.ms": 0,
                    "acks": "all",
                    "enable.idempotence": True,
                    "message.timeout.ms": 600_000,
                    "log_level": 2,
                }
            )
        )

    def start(self) -> "ReleaseFollower":
        self._thread = threading.Thread(target=self._run, name="tailguard-releases", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._producer.flush(5)

    # -- the thread ----------------------------------------------------------
    def _consumer(self) -> Consumer | None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.broker,
                "group.id": f"tailguard-gateway-{self.instance}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
                "log_level": 2,
            }
        )
        while not self._stop.is_set():
            try:
                meta = consumer.list_topics(self.releases_topic, timeout=5)
                topic = meta.topics.get(self.releases_topic)
                if topic is not None and topic.error is None and topic.partitions:
                    consumer.assign(
                        [
                            TopicPartition(self.releases_topic, p, OFFSET_BEGINNING)
                            for p in sorted(topic.partitions)
                        ]
                    )
                    self.assigned = True
                    return consumer
            except Exception as exc:  # KafkaException: broker away; keep trying
                log.debug("tailguard gateway: releases not readable yet: %s", exc)
            self._stop.wait(2.0)
        consumer.close()
        return None

    def _run(self) -> None:
        consumer = self._consumer()
        if consumer is None:
            return
        try:
            while not self._stop.is_set():
                msg = consumer.poll(0.2)
                self._producer.poll(0)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        log.debug("tailguard gateway: releases: %s", err)
                    continue
                self.handle(msg.value())
        finally:
            consumer.close()

    def handle(self, value: bytes | None) -> str | None:
        """Apply one ``tailguard.release.v1`` record; returns what changed."""
        self.seen += 1
        if not value:
            return None
        try:
            decision = _decode_release(value)
        except msgspec.DecodeError as exc:
            self.bad += 1
            log.warning("tailguard gateway: unreadable release decision ignored: %s", exc)
            return None
        now_ms = int(time.time() * 1000)
        current = self.overrides.get(decision.experiment)
        new, change = apply_decision(current, decision, now_ms)
        if new is None or new is current:
            return None
        self.overrides[decision.experiment] = new
        experiments = self._experiments()
        routed = experiments.get(decision.experiment)
        if change is not None:
            # Route first (seconds matter), then persist, then tell the audit trail.
            self._on_change(dict(self.overrides))
        self.store.save(self.overrides)
        if change is None or routed is None:
            return change
        self.applied += 1
        record = audit_record(
            new, change, routed, instance=self.instance, source=self.source, now_ms=now_ms
        )
        log.warning("tailguard gateway: %s", record["summary"])
        self._send_audit(record)
        return change

    def _send_audit(self, record: dict[str, Any]) -> None:
        def report(err: Any, _msg: Any) -> None:
            if err is not None:
                self.audits_failed += 1
                log.error("tailguard gateway: audit record not delivered: %s", err)

        headers = ce_headers(record["schema"], record["event_id"], record["ts_ms"], self.source)
        self._producer.produce(
            self.audit_topic,
            key=record["args"]["experiment"].encode(),
            value=msgspec.json.encode(record),
            headers=headers,
            on_delivery=report,
        )
        self._producer.poll(0)
