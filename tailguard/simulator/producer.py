"""Send simulated inference events to Kafka (``tailguard.inference``), and KV snapshots.

Each Kafka message is a JSON array of up to ``batch_size`` events whose series
share a home partition (:mod:`tailguard.schemas.placement`); the key is the
series key of its first event, so librdkafka's default partitioner puts it on
that partition and the worker folds it with one broker hop. When the topic's
partition count is unknown, a message holds one series. The producer is
idempotent with ``acks=all``, lingers 20 ms and compresses with lz4.

With ``kv_topic`` set, the KV-cache snapshots of every instance
(:mod:`tailguard.simulator.kv`, one every ``kv_interval_s`` of event time) go
to that topic (``tailguard.kv``) as one JSON object per message keyed by the
instance, interleaved with the inference batches in event time.

Pacing::

    realtime   start_ms := now; a batch is sent once the wall clock reaches the
               ts_ms of its last event, so a 60 s run lasts ~60 s and event
               time tracks wall-clock time (batches close after ≤ 1 s)
    max        as fast as possible; event time is synthetic from cfg.start_ms

The Kafka client sits behind :class:`ProducerPort` (confluent-kafka's
``Producer`` satisfies it), so tests can pass an in-memory double.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, Protocol

import msgspec

from tailguard.schemas.columnar import encode_columns
from tailguard.schemas.placement import by_home_partition, series_key_of
from tailguard.simulator.config import SimConfig
from tailguard.simulator.errors import SimulatorError
from tailguard.simulator.kv import DEFAULT_KV_INTERVAL_S, KvTracker
from tailguard.simulator.model import batch_events, generate, generate_batches

__all__ = [
    "INFERENCE_TOPIC",
    "KV_TOPIC",
    "MAX_MESSAGE_BYTES",
    "PACES",
    "ProducerPort",
    "Stats",
    "producer_config",
    "run",
]

INFERENCE_TOPIC = "tailguard.inference"
KV_TOPIC = "tailguard.kv"
PACES: tuple[str, ...] = ("realtime", "max")
MAX_MESSAGE_BYTES = 900_000  # below the broker's default 1 MiB message.max.bytes
Pace = Literal["realtime", "max"]

_KAFKA_LOG = logging.getLogger("tailguard.simulator.kafka")
_KAFKA_LOG.addHandler(logging.NullHandler())  # librdkafka chatter only if the app asks for it


class ProducerPort(Protocol):
    """The part of ``confluent_kafka.Producer`` the simulator uses."""

    def produce(
        self,
        topic: str,
        *,
        value: bytes,
        key: bytes,
        on_delivery: Callable[[Any, Any], None],
        headers: list[tuple[str, str | bytes | None]],
    ) -> None: ...

    def poll(self, timeout: float) -> int: ...

    def flush(self, timeout: float) -> int: ...

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...


@dataclass(slots=True)
class Stats:
    """What a run sent. ``failed_*`` count delivery failures (and messages still
    queued when the final flush timed out); ``last_error`` is the latest reason."""

    events: int = 0
    messages: int = 0
    bytes: int = 0
    delivered_events: int = 0
    delivered_messages: int = 0
    failed_events: int = 0
    failed_messages: int = 0
    last_error: str | None = None
    first_ts_ms: int | None = None
    last_ts_ms: int | None = None
    elapsed_s: float = 0.0
    interrupted: bool = False
    #: KV snapshots sent (one per instance and interval; 0 without ``kv_topic``).
    kv_snapshots: int = 0

    @property
    def events_per_s(self) -> float:
        """Events handed to the producer per second of run time."""
        return self.events / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly copy."""
        out = asdict(self)
        out["events_per_s"] = round(self.events_per_s, 1)
        return out


def producer_config(broker: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The confluent-kafka settings the simulator uses (``overrides`` win)."""
    conf: dict[str, Any] = {
        "bootstrap.servers": broker,
        "client.id": "tailguard-simulator",
        "linger.ms": 20,
        "compression.type": "lz4",
        "acks": "all",
        "enable.idempotence": True,
        "message.timeout.ms": 60_000,
        "logger": _KAFKA_LOG,
    }
    conf.update(overrides or {})
    return conf


def _reason(exc: BaseException) -> str:
    err: Any = exc.args[0] if exc.args else exc
    return str(err.str()) if hasattr(err, "str") else str(err)


def _unreachable(broker: str, exc: BaseException) -> SimulatorError:
    why = _reason(exc)
    msg = (
        f"cannot reach the Kafka broker at {broker} ({why}). Start the local broker "
        "with `make kafka-up`, or point --broker / TAILGUARD_BROKER at a running one."
    )
    return SimulatorError(msg)


def _connect(broker: str, overrides: Mapping[str, Any] | None, timeout_s: float) -> ProducerPort:
    from confluent_kafka import KafkaException, Producer

    try:
        producer: ProducerPort = Producer(producer_config(broker, overrides))
    except KafkaException as exc:
        msg = f"invalid Kafka producer settings for {broker}: {exc}"
        raise SimulatorError(msg) from None
    try:
        producer.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise _unreachable(broker, exc) from None
    return producer


def _check_topic(producer: ProducerPort, broker: str, topic: str, timeout_s: float) -> int | None:
    """Fail early when ``topic`` is missing; return its partition count (None: not said).

    A broker that auto-creates topics answers the first metadata request with
    UNKNOWN_TOPIC_OR_PART and creates the topic, so the check asks again for up
    to ``min(timeout_s, 5)`` seconds before it gives up."""
    from confluent_kafka import KafkaError, KafkaException

    deadline = time.monotonic() + min(timeout_s, 5.0)
    while True:
        try:
            meta = producer.list_topics(topic=topic, timeout=timeout_s)
        except KafkaException as exc:
            raise _unreachable(broker, exc) from None
        tmeta = meta.topics.get(topic)
        err = getattr(tmeta, "error", None) if tmeta is not None else None
        missing = tmeta is None or (
            err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        )
        if not missing:
            partitions = getattr(tmeta, "partitions", None)
            return len(partitions) if partitions else None
        if time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    msg = (
        f"topic {topic!r} does not exist on {broker} and the broker does not create "
        "it automatically: create the tailguard topics first (`make kafka-up` starts "
        "a broker that auto-creates them), or pass another --topic."
    )
    raise SimulatorError(msg)


def _placed(
    batch: list[dict[str, Any]], partitions: int | None
) -> list[tuple[bytes, list[dict[str, Any]]]]:
    """``batch`` split by home partition (by series when the count is unknown),
    each part with the message key that places it there."""
    if partitions is None:
        by_series: dict[str, list[dict[str, Any]]] = {}
        for event in batch:
            by_series.setdefault(series_key_of(event), []).append(event)
        return [(key.encode(), events) for key, events in by_series.items()]
    return [
        (key.encode(), list(events))  # type: ignore[arg-type]
        for key, events in by_home_partition(batch, partitions).values()
    ]


def _encode(batch: list[dict[str, Any]], max_bytes: int) -> Iterator[tuple[int, bytes]]:
    """``(n_events, payload)`` pairs of columnar messages
    (:mod:`tailguard.schemas.columnar`); a batch too big for one message is halved."""
    payload = encode_columns(batch)
    if len(payload) <= max_bytes or len(batch) == 1:
        yield len(batch), payload
        return
    mid = len(batch) // 2
    yield from _encode(batch[:mid], max_bytes)
    yield from _encode(batch[mid:], max_bytes)


class _Delivery:
    """Counts delivery reports into ``stats``."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def callback(self, n_events: int) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, _msg: Any) -> None:
            if err is None:
                self.stats.delivered_messages += 1
                self.stats.delivered_events += n_events
            else:
                self.stats.failed_messages += 1
                self.stats.failed_events += n_events
                self.stats.last_error = str(err)

        return on_delivery


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def run(
    cfg: SimConfig,
    *,
    broker: str,
    topic: str = INFERENCE_TOPIC,
    batch_size: int = 200,
    pace: Pace = "realtime",
    on_progress: Callable[[Stats], None] | None = None,
    progress_interval_s: float = 1.0,
    connect_timeout_s: float = 10.0,
    flush_timeout_s: float = 30.0,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    kafka_config: Mapping[str, Any] | None = None,
    producer: ProducerPort | None = None,
    kv_topic: str | None = None,
    kv_interval_s: float = DEFAULT_KV_INTERVAL_S,
) -> Stats:
    """Generate ``cfg``'s events and produce them to ``topic``; return what was sent.

    ``pace="realtime"`` replaces ``cfg.start_ms`` with the current time and sends
    each batch when the wall clock reaches its last event; ``"max"`` sends as
    fast as the producer accepts. ``on_progress(stats)`` is called at most every
    ``progress_interval_s`` and once at the end. Ctrl-C stops generating, flushes
    what was sent and returns with ``stats.interrupted = True``.

    ``kv_topic``: also send each instance's KV snapshot every ``kv_interval_s``
    of event time to that topic (keyed by instance; paced like the events).

    Raises :class:`SimulatorError` when the broker cannot be reached within
    ``connect_timeout_s`` or a topic does not exist. ``producer`` replaces the
    confluent-kafka producer (tests); ``kafka_config`` overrides its settings.
    """
    if pace not in PACES:
        msg = f"pace must be one of {', '.join(PACES)}, got {pace!r}"
        raise ValueError(msg)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        msg = f"batch_size must be an integer >= 1, got {batch_size!r}"
        raise ValueError(msg)
    if producer is None:
        producer = _connect(broker, kafka_config, connect_timeout_s)
    partitions = _check_topic(producer, broker, topic, connect_timeout_s)
    if kv_topic is not None:
        _check_topic(producer, broker, kv_topic, connect_timeout_s)
    if pace == "realtime":
        cfg = replace(cfg, start_ms=_now_ms())
    tracker = KvTracker(cfg, interval_s=kv_interval_s) if kv_topic is not None else None

    stats = Stats()
    delivery = _Delivery(stats)
    encoder = msgspec.json.Encoder()
    headers: list[tuple[str, str | bytes | None]] = [("content-type", b"application/json")]
    started = time.monotonic()
    next_report = started + progress_interval_s

    def report(force: bool = False) -> None:
        nonlocal next_report
        stats.elapsed_s = time.monotonic() - started
        if on_progress is not None and (force or time.monotonic() >= next_report):
            next_report = time.monotonic() + progress_interval_s
            on_progress(stats)

    def send(n_events: int, key: bytes, payload: bytes, to: str = topic) -> None:
        while True:
            try:
                producer.produce(
                    to,
                    value=payload,
                    key=key,
                    on_delivery=delivery.callback(n_events),
                    headers=headers,
                )
                break
            except BufferError:  # local queue full: serve delivery reports, retry
                producer.poll(0.1)
        stats.messages += 1
        stats.events += n_events
        stats.bytes += len(payload)

    def send_kv(snapshots: list[dict[str, Any]]) -> None:
        assert kv_topic is not None
        for snap in snapshots:
            if pace == "realtime":
                while (wait_ms := snap["ts_ms"] - _now_ms()) > 0:
                    producer.poll(min(wait_ms / 1000.0, 0.2))
                    report()
            send(0, snap["instance"].encode(), encoder.encode(snap), kv_topic)
            stats.kv_snapshots += 1

    batches = (
        generate_batches(cfg, batch_size)
        if tracker is None
        else batch_events(tracker.watch(generate(cfg)), batch_size)
    )
    try:
        for batch in batches:
            if pace == "realtime":
                due_ms = batch[-1]["ts_ms"]
                while (wait_ms := due_ms - _now_ms()) > 0:
                    producer.poll(min(wait_ms / 1000.0, 0.2))
                    report()
            for key, events in _placed(batch, partitions):
                for n_events, payload in _encode(events, max_message_bytes):
                    send(n_events, key, payload)
            lo, hi = batch[0]["ts_ms"], batch[-1]["ts_ms"]
            stats.first_ts_ms = lo if stats.first_ts_ms is None else min(lo, stats.first_ts_ms)
            stats.last_ts_ms = hi if stats.last_ts_ms is None else max(hi, stats.last_ts_ms)
            if tracker is not None:
                send_kv(tracker.due())
            producer.poll(0)
            report()
        if tracker is not None:
            send_kv(tracker.finish())
    except KeyboardInterrupt:
        stats.interrupted = True
    finally:
        left = producer.flush(flush_timeout_s)
        if left:
            stats.failed_messages += left
            stats.failed_events = stats.events - stats.delivered_events
            stats.last_error = f"{left} message(s) still queued after a {flush_timeout_s:g} s flush"
    report(force=True)
    return stats
