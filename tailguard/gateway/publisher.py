"""Inference events out of the gateway: a bounded buffer and a background producer.

::

    request handlers (event loop)          publisher thread
    ───────────────────────────            ──────────────────────────────────────────
    submit(event) ─▶ deque (≤ buffer_events) ─▶ every linger_ms: take ≤ batch_events,
      O(1), never blocks, never raises          group by series, JSON arrays ≤ 900 kB
      full: the *oldest* event is dropped       per group ─▶ librdkafka (≤ max_in_flight events
      and counted                               not yet acknowledged) ─▶ tailguard.inference

A request never waits for Kafka: ``submit`` appends under a lock held for
a few hundred nanoseconds, and everything else happens on the thread. One
bound covers everything held: events in the deque plus events handed to
librdkafka and not yet acknowledged never exceed ``buffer_events``. While the
broker is away, batches stay in librdkafka (up to ``max_in_flight`` events,
``message.timeout.ms`` long) and the rest in the deque; what does not fit is
dropped oldest-first — newer events describe the service better; the newest
when everything held is already with librdkafka — and counted in ``dropped``.
A batch librdkafka gives up on (its timeout) goes back to the front of the
deque while there is room. When the broker returns, the backlog
drains in order of arrival per key.

Messages are keyed by their series (``service|model|variant|tenant``), so
librdkafka's default partitioner puts each on its series' home partition
(:mod:`tailguard.schemas.placement`) and the worker folds it with one hop.
"""

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from confluent_kafka import KafkaError, Producer

from tailguard.schemas.columnar import encode_columns
from tailguard.schemas.placement import series_key_of

__all__ = ["EventPublisher", "PublisherStats"]

log = logging.getLogger(__name__)

_encode = msgspec.json.Encoder().encode


@dataclass(slots=True)
class PublisherStats:
    """Counters of one publisher (read without a lock: each is one int)."""

    submitted: int = 0
    published: int = 0
    dropped: int = 0
    requeued: int = 0
    #: Events larger than a message may be (never sent).
    oversize: int = 0
    messages: int = 0
    delivery_errors: int = 0
    broker_errors: int = 0
    broker_up: bool = False


class EventPublisher:
    """Sends event dicts to ``topic`` off the request path; see the module docstring."""

    def __init__(
        self,
        broker: str,
        topic: str,
        *,
        buffer_events: int = 100_000,
        batch_events: int = 500,
        linger_ms: float = 50.0,
        max_in_flight: int | None = None,
        message_timeout_ms: int = 600_000,
        max_message_bytes: int = 900_000,
        key: Callable[[Mapping[str, Any]], str] | None = None,
        producer: Any = None,
        columns: bool = False,
    ) -> None:
        self.topic = topic
        #: Messages in the columnar form of ``tailguard.inference`` (fewer bytes, and
        #: the worker reads it without an object per request); else JSON arrays.
        self.columns = columns
        self.buffer_events = buffer_events
        self.batch_events = batch_events
        self.linger_s = linger_ms / 1000
        self.max_in_flight = min(max_in_flight or max(batch_events * 20, 10_000), buffer_events)
        #: Below the 1 MiB a worker accepts per message (``schemas.Limits``).
        self.max_message_bytes = max_message_bytes
        self.stats = PublisherStats()
        # Keyed by series: librdkafka's default partitioner then puts each message
        # on its series' home partition, where the worker folds it in one hop.
        self._key = key or series_key_of
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._producer = (
            producer
            if producer is not None
            else Producer(
                {
                    "bootstrap.servers": broker,
                    "linger.ms": 5,
                    "compression.type": "lz4",
                    "acks": "all",
                    "message.timeout.ms": message_timeout_ms,
                    "message.max.bytes": 8_000_000,
                    "queue.buffering.max.messages": 1_000_000,
                    "reconnect.backoff.max.ms": 1000,
                    "error_cb": self._on_error,
                    # librdkafka repeats "connection refused" per retry while the broker
                    # is away; the publisher reports the state once (error_cb) instead.
                    "log_level": 2,
                }
            )
        )

    # -- request path ------------------------------------------------------
    def submit(self, event: dict[str, Any]) -> None:
        """Queue one event; O(1), never blocks. A full buffer drops its oldest event."""
        q = self._queue
        with self._lock:
            self.stats.submitted += 1
            if len(q) + self._in_flight >= self.buffer_events:
                self.stats.dropped += 1
                if not q:
                    return  # everything held is already with librdkafka: drop the newest
                q.popleft()
            q.append(event)

    # -- state ---------------------------------------------------------------
    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def buffered(self) -> int:
        """Events accepted and not yet acknowledged by the broker."""
        return len(self._queue) + self._in_flight

    # -- thread --------------------------------------------------------------
    def start(self) -> "EventPublisher":
        self._thread = threading.Thread(target=self._run, name="tailguard-publisher", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread after trying for ``timeout_s`` to deliver what is buffered."""
        deadline = time.monotonic() + timeout_s
        while self.buffered and time.monotonic() < deadline and self._thread is not None:
            time.sleep(0.05)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        left = self.buffered
        if left:
            log.warning("tailguard gateway: %d events not delivered at shutdown", left)

    def _run(self) -> None:
        producer = self._producer
        while not self._stop.is_set():
            producer.poll(0)
            sent = self._drain_once()
            producer.poll(0 if sent else self.linger_s)

    def drain(self) -> int:
        """Hand one batch to librdkafka (the thread calls this; tests may too)."""
        return self._drain_once()

    def _drain_once(self) -> int:
        room = min(self.batch_events, self.max_in_flight - self._in_flight)
        if room <= 0 or not self._queue:
            return 0
        with self._lock:
            take = min(room, len(self._queue))
            batch = [self._queue.popleft() for _ in range(take)]
        groups: dict[str, list[dict[str, Any]]] = {}
        for event in batch:
            groups.setdefault(self._key(event), []).append(event)
        limit = self.max_message_bytes
        for key, events in groups.items():
            parts: list[bytes] = []
            members: list[dict[str, Any]] = []
            size = 2
            for event in events:
                raw = _encode(event)
                if len(raw) + 2 > limit:
                    self.stats.oversize += 1  # the worker would dead-letter it whole
                    continue
                if parts and size + len(raw) + 1 > limit:
                    self._produce(key, parts, members)
                    parts, members, size = [], [], 2
                parts.append(raw)
                members.append(event)
                size += len(raw) + 1
            if parts:
                self._produce(key, parts, members)
        return take

    def _produce(self, key: str, parts: list[bytes], events: list[dict[str, Any]]) -> None:
        # Columns take fewer bytes than the rows ``parts`` were measured as.
        value = encode_columns(events) if self.columns else b"[" + b",".join(parts) + b"]"
        n = len(events)

        def delivered(err: Any, _msg: Any) -> None:
            self._in_flight -= n
            if err is None:
                self.stats.published += n
                self.stats.messages += 1
                self.stats.broker_up = True
                return
            self.stats.delivery_errors += 1
            self._requeue(events)

        while True:
            try:
                self._producer.produce(
                    self.topic, value=value, key=key.encode(), on_delivery=delivered
                )
                break
            except BufferError:
                self._producer.poll(0.05)
        self._in_flight += n

    def _requeue(self, events: list[dict[str, Any]]) -> None:
        """Put a failed batch back in front, as far as the bound allows."""
        q = self._queue
        with self._lock:
            room = self.buffer_events - len(q) - self._in_flight
            keep = events[-room:] if room > 0 else []
            self.stats.dropped += len(events) - len(keep)
            q.extendleft(reversed(keep))
            self.stats.requeued += len(keep)

    def _on_error(self, err: KafkaError) -> None:
        self.stats.broker_errors += 1
        if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            if self.stats.broker_up or self.stats.broker_errors == 1:
                log.warning("tailguard gateway: Kafka unreachable (%s); buffering events", err)
            self.stats.broker_up = False
