"""``tailguard alerts forward``: breaches and decisions to an Alertmanager-style webhook.

One confluent-kafka consumer in its own consumer group (``enable.auto.commit``
off) reads ``tailguard.breaches`` and/or ``tailguard.releases``. Records are
handled one at a time, in partition order::

    poll ─▶ decode ─┬─ not an event ──────────────────────────────────┐ (warned, counted)
                    ├─ filtered out (silenced breaches too) ──────────┤
                    ├─ event_id in the delivery log ──────────────────┤ (delivered before
                    │                                                 │  a crash: no POST)
                    └─ POST ─ fail ─▶ pause all partitions, wait      │
                         ▲            backoff (polling, so the group  │
                         └──────────  keeps us), POST again …         │
                         2xx ─▶ log.record(event_id) ─────────────────┴─▶ commit(offset + 1)
                                                                          synchronously

Nothing is skipped because the receiver is down or refuses: the forwarder
retries forever (exponential backoff with jitter, bounded by ``--backoff-max``)
until a 2xx or SIGTERM. Head-of-line blocking is deliberate: later events wait
behind the one that does not go through, so a breach's transitions reach the
receiver in order. A stop or a revoked partition during the retries abandons
the record without committing it; whoever owns the partition next delivers it.

What a receiver can still see twice (at-least-once; it deduplicates on the
``Idempotency-Key`` header, the event id, also in the annotation ``event_id``):

- a crash after the 2xx and before the delivery log reached the disk
  (microseconds to a few milliseconds of fsync);
- a POST the receiver accepted but whose answer was lost (timeout, reset): the
  forwarder cannot tell this from a failure and sends it again;
- a partition that moves to a forwarder with another state file (several
  forwarders in one group, or a lost state file): at most the last record per
  partition whose commit had not gone through.
"""

import logging
import random
import signal
import threading
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from time import monotonic as _now
from typing import Any, Literal, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from tailguard.alerts.alertmanager import encode, webhook_message
from tailguard.alerts.delivery import Backoff, DeliveryLog
from tailguard.alerts.errors import BadEvent
from tailguard.alerts.events import AlertEvent, EventFilter, EventKind, decode_event
from tailguard.alerts.webhook import Webhook
from tailguard.errors import TailguardError

__all__ = [
    "ConsumerPort",
    "ForwardOptions",
    "ForwardStats",
    "Forwarder",
    "ForwarderFailed",
    "consumer_config",
    "run_forward",
]

log = logging.getLogger("tailguard.alerts.forward")


class ForwarderFailed(TailguardError, RuntimeError):
    """The consumer failed in a way it cannot recover from (fenced, fatal error)."""


class ConsumerPort(Protocol):
    """The part of ``confluent_kafka.Consumer`` the forwarder uses."""

    def poll(self, timeout: float) -> Any: ...

    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]: ...

    def pause(self, partitions: list[TopicPartition]) -> None: ...

    def resume(self, partitions: list[TopicPartition]) -> None: ...

    def assignment(self) -> list[TopicPartition]: ...


@dataclass
class ForwardStats:
    """Counters of one forwarder run."""

    delivered: int = 0
    attempts: int = 0
    failed_attempts: int = 0
    filtered: int = 0
    #: Silenced breach transitions not POSTed (``--include-silenced`` sends them).
    silenced: int = 0
    already_delivered: int = 0
    bad: int = 0
    commit_errors: int = 0

    def line(self) -> str:
        return (
            f"delivered {self.delivered} ({self.attempts} POSTs, {self.failed_attempts} failed), "
            f"already delivered {self.already_delivered}, filtered out {self.filtered}, "
            f"silenced {self.silenced}, not events {self.bad}, commit errors {self.commit_errors}"
        )


class Forwarder:
    """Consumes events and POSTs each until a 2xx, committing only after delivery.

    ``kinds`` maps each subscribed topic to the kind of event it carries;
    ``render`` turns an event into the body to POST.
    """

    def __init__(
        self,
        consumer: ConsumerPort,
        webhook: Webhook,
        delivery_log: DeliveryLog,
        *,
        kinds: Mapping[str, EventKind],
        render: Callable[[AlertEvent], bytes],
        event_filter: EventFilter | None = None,
        backoff: Backoff | None = None,
        stop: threading.Event | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.consumer = consumer
        self.webhook = webhook
        self.delivery_log = delivery_log
        self.kinds = dict(kinds)
        self.render = render
        self.filter = event_filter or EventFilter(include_silenced=False)
        self.backoff = backoff or Backoff()
        self.stop = stop or threading.Event()
        self.rng = rng or random.Random()
        self.stats = ForwardStats()
        self._revoked: set[tuple[str, int]] = set()
        self._paused = False
        #: Records that arrived while paused (from a partition assigned meanwhile): next.
        self._pending: deque[Any] = deque()

    # -- rebalance callbacks (confluent-kafka calls them from inside poll) ---------------

    def on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        log.info("assigned %s", _names(partitions))

    def on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self._revoked |= gone
        self._pending = deque(m for m in self._pending if (m.topic(), m.partition()) not in gone)
        log.info("revoked %s", _names(partitions))

    # -- the loop ---------------------------------------------------------------------

    def run(self, poll_s: float = 0.5) -> ForwardStats:
        """Forward until :attr:`stop` is set; returns the counters."""
        while not self.stop.is_set():
            self.step(poll_s)
        return self.stats

    def step(self, poll_s: float = 0.5) -> bool:
        """Handle at most one record; True when one was handled to the end (committed)."""
        msg = self._pending.popleft() if self._pending else self.consumer.poll(poll_s)
        if msg is None or not self._usable(msg):
            return False
        return self.handle(msg)

    def _usable(self, msg: Any) -> bool:
        error = msg.error()
        if error is None:
            return True
        if error.code() == KafkaError._PARTITION_EOF:
            return False
        if error.fatal():
            msg_ = f"the Kafka consumer failed: {error.str()}; restart the forwarder"
            raise ForwarderFailed(msg_)
        log.warning("consumer: %s", error.str())
        return False

    def handle(self, msg: Any) -> bool:
        """Deliver one record (unless it is filtered out or delivered), then commit it."""
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        self._revoked.clear()
        try:
            event = decode_event(msg.value(), self.kinds[topic])
        except BadEvent as exc:
            self.stats.bad += 1
            log.warning("%s[%d]@%d is not an event, skipped: %s", topic, partition, offset, exc)
            return self._commit(topic, partition, offset)
        if self.filter.mutes(event):
            self.stats.silenced += 1
            log.info(
                "%s is silenced (silence %s): not forwarded",
                event.event_id,
                event.body.get("silence_id"),
            )
            return self._commit(topic, partition, offset)
        if not self.filter.matches(event):
            self.stats.filtered += 1
            return self._commit(topic, partition, offset)
        if self.delivery_log.delivered(topic, partition, event.event_id):
            self.stats.already_delivered += 1
            log.info("%s already delivered (delivery log): committing only", event.event_id)
            return self._commit(topic, partition, offset)
        if not self._deliver(msg, event):
            return False
        self.delivery_log.record(topic, partition, offset, event.event_id)
        return self._commit(topic, partition, offset)

    def _deliver(self, msg: Any, event: AlertEvent) -> bool:
        body = self.render(event)
        headers = {"Idempotency-Key": event.event_id}
        key = (msg.topic(), msg.partition())
        attempt = 0
        try:
            while True:
                outcome = self.webhook.post(body, headers)
                self.stats.attempts += 1
                if outcome.ok:
                    self.stats.delivered += 1
                    log.info(
                        "delivered %s %s (%s) → %s%s",
                        event.kind,
                        event.event_id,
                        event.severity,
                        outcome.detail,
                        f" after {attempt + 1} attempts" if attempt else "",
                    )
                    return True
                self.stats.failed_attempts += 1
                delay = self.backoff.delay(attempt, self.rng)
                if outcome.retry_after_s is not None:
                    delay = max(delay, min(outcome.retry_after_s, self.backoff.max_s))
                attempt += 1
                log.warning(
                    "POST of %s failed (attempt %d: %s); retrying in %.2f s",
                    event.event_id,
                    attempt,
                    outcome.detail,
                    delay,
                )
                self._pause()
                if not self._wait(delay, key):
                    return False
        finally:
            self._resume()

    def _wait(self, seconds: float, key: tuple[str, int]) -> bool:
        """Sleep ``seconds`` while polling (so the group keeps this member).

        False when told to stop, or when the record's partition was revoked.
        """
        deadline = _now() + seconds
        while True:
            if self.stop.is_set():
                return False
            if key in self._revoked:
                log.warning(
                    "%s[%d] was revoked while retrying; its next owner delivers the record",
                    *key,
                )
                return False
            left = deadline - _now()
            if left <= 0:
                return True
            stray = self.consumer.poll(min(left, 0.2))
            if stray is not None and stray.error() is None:
                # A partition assigned while paused is not paused: keep its record for
                # later (in order) and pause it too.
                self._pending.append(stray)
                self.consumer.pause([TopicPartition(stray.topic(), stray.partition())])

    def _pause(self) -> None:
        if not self._paused:
            self.consumer.pause(self.consumer.assignment())
            self._paused = True

    def _resume(self) -> None:
        if self._paused:
            self._paused = False
            try:
                self.consumer.resume(self.consumer.assignment())
            except KafkaException as exc:
                log.warning("could not resume the partitions: %s", exc)

    def _commit(self, topic: str, partition: int, offset: int) -> bool:
        tp = TopicPartition(topic, partition, offset + 1)
        try:
            result = self.consumer.commit(offsets=[tp], asynchronous=False)
        except KafkaException as exc:
            self.stats.commit_errors += 1
            log.warning(
                "commit of %s[%d]@%d failed (%s); the delivery log keeps it from being "
                "POSTed twice",
                topic,
                partition,
                offset + 1,
                exc.args[0] if exc.args else exc,
            )
            return False
        for done in result or ():
            if done.error is not None:
                self.stats.commit_errors += 1
                log.warning("commit of %s[%d] failed: %s", topic, partition, done.error)
                return False
        return True


def _names(partitions: Collection[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions) or "nothing"


@dataclass(frozen=True, slots=True)
class ForwardOptions:
    """Everything ``tailguard alerts forward`` was told, checked by the CLI."""

    broker: str
    webhook: Webhook
    #: Full topic name (namespace prefix included) → the events it carries.
    kinds: Mapping[str, EventKind]
    group: str
    state_file: Path
    instance_id: str | None = None
    from_beginning: bool = False
    #: Silenced breaches do not page unless the filter says ``include_silenced``.
    event_filter: EventFilter = field(default_factory=lambda: EventFilter(include_silenced=False))
    backoff: Backoff = field(default_factory=Backoff)
    receiver: str = "tailguard"
    external_url: str = ""
    generator_url: str = ""


def consumer_config(opts: ForwardOptions) -> dict[str, Any]:
    """The confluent-kafka settings of the forwarder's consumer.

    With ``instance_id`` the member is *static* (KIP-345): a forwarder
    restarted under the same id takes its partitions back at once instead of
    waiting for the session of the crashed one to time out.
    """
    conf: dict[str, Any] = {
        "bootstrap.servers": opts.broker,
        "group.id": opts.group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest" if opts.from_beginning else "latest",
        "enable.partition.eof": False,
        # A retry loop polls paused partitions, so the member never looks stuck.
        "max.poll.interval.ms": 300_000,
    }
    if opts.instance_id:
        conf["group.instance.id"] = opts.instance_id
    return conf


def run_forward(opts: ForwardOptions) -> ForwardStats:
    """Forward until SIGTERM or SIGINT; returns the counters.

    Raises :class:`~tailguard.kafka_admin.BrokerUnavailable` or
    :class:`~tailguard.console.TopicMissing` with what to do before starting.
    """
    from tailguard.console import TopicMissing
    from tailguard.kafka_admin import ensure_broker

    admin = ensure_broker(opts.broker)
    listed = admin.list_topics(timeout=10).topics
    missing = [t for t in opts.kinds if t not in listed or listed[t].error is not None]
    if missing:
        which = (
            f"topics {', '.join(missing)} do not"
            if len(missing) > 1
            else f"topic {missing[0]} does not"
        )
        msg = (
            f"{which} exist on {opts.broker}; run `tailguard topics create` (or set "
            "TAILGUARD_TOPIC_PREFIX to the deployment's namespace)"
        )
        raise TopicMissing(msg)
    delivery_log = DeliveryLog.load(opts.state_file)

    def render(event: AlertEvent) -> bytes:
        return encode(
            webhook_message(
                event,
                receiver=opts.receiver,
                external_url=opts.external_url,
                generator_url=opts.generator_url,
            )
        )

    stop = threading.Event()
    consumer = Consumer(consumer_config(opts))
    forwarder = Forwarder(
        consumer,
        opts.webhook,
        delivery_log,
        kinds=opts.kinds,
        render=render,
        event_filter=opts.event_filter,
        backoff=opts.backoff,
        stop=stop,
    )
    consumer.subscribe(
        list(opts.kinds),
        on_assign=forwarder.on_assign,
        on_revoke=forwarder.on_revoke,
        on_lost=forwarder.on_revoke,
    )

    def request_stop(signum: int, _frame: Any) -> None:
        log.info("%s: finishing the current attempt, then stopping", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    log.info(
        "forwarding %s to %s as group %s (delivery log %s)",
        ", ".join(opts.kinds),
        getattr(opts.webhook, "url", opts.webhook),
        opts.group,
        opts.state_file,
    )
    try:
        return forwarder.run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        consumer.close()
        log.info("stopped: %s", forwarder.stats.line())
