"""The sampling loop: a :class:`~tailguard.gpu.reader.GpuReader` → ``tailguard.gpu`` on Kafka.

Every ``interval_s`` the loop asks the reader for one sample per GPU and
produces each as its own message:

- value: the ``tailguard.gpu.v1`` JSON (``schema`` set; fields NVML could not
  read are left out, which the contract reads as null);
- key: ``"host:gpu"``, so one GPU's samples stay in order on one
  partition;
- headers: CloudEvents binary mode (``ce_type`` = the schema id, ``ce_id`` =
  ``host:gpu:ts_ms``, ``ce_source`` = ``tailguard-gpu-sampler/<sampler host>``).

Ticks are aligned to the start (``t0 + k·interval_s``); a round that overruns
skips the ticks it missed rather than bunching samples. SIGINT or SIGTERM
stops the loop after the current round; queued messages are flushed. A second
SIGINT interrupts the round itself (then the flush runs, as after the first).

The Kafka client sits behind :class:`ProducerPort`: confluent-kafka's
``Producer`` satisfies it, :class:`JsonLinesProducer` writes the values to a
stream instead (``--print``), and tests pass an in-memory double.
"""

from __future__ import annotations

import logging
import math
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from types import FrameType
from typing import IO, Any, Final, Protocol, cast

import msgspec

from tailguard.catalogue import GPU, default_prefix
from tailguard.gpu.errors import BrokerError, GpuConfigError
from tailguard.gpu.reader import GpuReader
from tailguard.schemas import SCHEMA_IDS, GpuSample, ce_headers, encode

__all__ = [
    "GPU_TOPIC",
    "JsonLinesProducer",
    "ProducerPort",
    "SamplerStats",
    "default_topic",
    "message_of",
    "producer_config",
    "run",
]

GPU_TOPIC: Final = GPU
_SCHEMA: Final = SCHEMA_IDS["gpu"]
_log = logging.getLogger("tailguard.gpu")
_KAFKA_LOG = logging.getLogger("tailguard.gpu.kafka")
_KAFKA_LOG.addHandler(logging.NullHandler())  # librdkafka chatter only if the app asks for it
_WAIT_SLICE_S: Final = 0.2
_WARN_EVERY_S: Final = 30.0


def default_topic() -> str:
    """``tailguard.gpu`` behind the namespace prefix (env ``TAILGUARD_TOPIC_PREFIX``)."""
    return default_prefix() + GPU_TOPIC


class ProducerPort(Protocol):
    """The part of ``confluent_kafka.Producer`` the sampler uses."""

    def produce(
        self,
        topic: str,
        *,
        value: bytes,
        key: bytes,
        headers: list[tuple[str, bytes]],
        on_delivery: Callable[[Any, Any], None],
    ) -> None: ...

    def poll(self, timeout: float) -> int: ...

    def flush(self, timeout: float) -> int: ...


class JsonLinesProducer:
    """A :class:`ProducerPort` that writes each value as one line to ``stream``."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream

    def produce(
        self,
        topic: str,
        *,
        value: bytes,
        key: bytes,
        headers: list[tuple[str, bytes]],
        on_delivery: Callable[[Any, Any], None],
    ) -> None:
        self.stream.write(value + b"\n")
        on_delivery(None, None)

    def poll(self, timeout: float) -> int:
        self.stream.flush()
        return 0

    def flush(self, timeout: float) -> int:
        self.stream.flush()
        return 0


@dataclass(slots=True)
class SamplerStats:
    """What a run did. ``failed`` counts delivery failures and messages still
    queued when the final flush timed out; ``dropped`` samples the local queue
    had no room for; ``stopped_by`` is the signal that ended the run."""

    rounds: int = 0
    samples: int = 0
    delivered: int = 0
    failed: int = 0
    dropped: int = 0
    last_error: str | None = None
    elapsed_s: float = 0.0
    stopped_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly copy."""
        return asdict(self)


def producer_config(broker: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The confluent-kafka settings of the sampler (``overrides`` win).

    A sample older than 30 s is worthless, so ``message.timeout.ms`` is short.
    """
    conf: dict[str, Any] = {
        "bootstrap.servers": broker,
        "client.id": "tailguard-gpu-sampler",
        "linger.ms": 50,
        "compression.type": "lz4",
        "acks": "all",
        "enable.idempotence": True,
        "message.timeout.ms": 30_000,
        "logger": _KAFKA_LOG,
    }
    conf.update(overrides or {})
    return conf


def message_of(sample: GpuSample, source_host: str) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """``(key, value, headers)`` of one sample's Kafka message."""
    if sample.schema is None:
        sample = msgspec.structs.replace(sample, schema=_SCHEMA)
    gpu_id = f"{sample.host}:{sample.gpu}"
    headers = ce_headers(
        _SCHEMA,
        f"{gpu_id}:{sample.ts_ms}",
        sample.ts_ms,
        source=f"tailguard-gpu-sampler/{source_host}",
    )
    return gpu_id.encode(), encode(sample), headers


def _reason(exc: BaseException) -> str:
    err: Any = exc.args[0] if exc.args else exc
    return str(err.str()) if hasattr(err, "str") else str(err)


def _connect(
    broker: str, topic: str, overrides: Mapping[str, Any] | None, timeout_s: float
) -> ProducerPort:
    """A confluent-kafka producer, after checking the broker answers and ``topic`` exists."""
    from confluent_kafka import KafkaError, KafkaException, Producer

    try:
        producer = Producer(producer_config(broker, overrides))
    except KafkaException as exc:
        msg = f"invalid Kafka producer settings for {broker}: {_reason(exc)}"
        raise BrokerError(msg) from None
    deadline = time.monotonic() + min(timeout_s, 5.0)
    while True:
        try:
            meta = producer.list_topics(topic=topic, timeout=timeout_s)
        except KafkaException as exc:
            msg = (
                f"cannot reach the Kafka broker at {broker} ({_reason(exc)}): start it with "
                "`make kafka-up`, or point --broker / TAILGUARD_BROKER at a running one"
            )
            raise BrokerError(msg) from None
        tmeta = meta.topics.get(topic)
        err = getattr(tmeta, "error", None) if tmeta is not None else None
        if tmeta is not None and (err is None or err.code() != KafkaError.UNKNOWN_TOPIC_OR_PART):
            return cast(ProducerPort, producer)
        if time.monotonic() >= deadline:  # an auto-creating broker needs a moment
            msg = (
                f"topic {topic!r} does not exist on {broker}: create the tailguard topics "
                "first (`tailguard topics create`), or pass another --topic"
            )
            raise BrokerError(msg)
        time.sleep(0.25)


class _Stop:
    """Set by SIGINT/SIGTERM; a second SIGINT raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def handler(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = name
        _log.info("%s received: stopping after this round", name)


@contextmanager
def _signals(stop: _Stop, install: bool) -> Iterator[None]:
    if not install or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, stop.handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run(
    reader: GpuReader,
    *,
    broker: str,
    topic: str | None = None,
    interval_s: float = 1.0,
    host: str | None = None,
    count: int | None = None,
    producer: ProducerPort | None = None,
    connect_timeout_s: float = 10.0,
    flush_timeout_s: float = 10.0,
    kafka_config: Mapping[str, Any] | None = None,
    on_round: Callable[[SamplerStats], None] | None = None,
    handle_signals: bool = True,
) -> SamplerStats:
    """Sample ``reader`` every ``interval_s`` and produce each sample to ``topic``.

    ``topic`` defaults to :func:`default_topic`; ``host`` (default: this
    machine's name) names the sampler in the CloudEvents ``ce_source``;
    ``count`` stops after that many rounds (default: until SIGINT/SIGTERM).
    ``producer`` replaces the confluent-kafka producer (``--print``, tests);
    ``kafka_config`` overrides its settings. ``on_round(stats)`` runs after
    every round.

    Raises :class:`~tailguard.gpu.errors.BrokerError` when the broker is
    unreachable within ``connect_timeout_s`` or the topic is missing, and lets
    the reader's :class:`~tailguard.gpu.errors.GpuSamplerError` through (every
    GPU lost).
    """
    if not (isinstance(interval_s, int | float) and math.isfinite(interval_s) and interval_s > 0):
        msg = f"interval_s must be a positive number of seconds, got {interval_s!r}"
        raise GpuConfigError(msg)
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        msg = f"count must be an integer >= 1 or None, got {count!r}"
        raise GpuConfigError(msg)
    topic = default_topic() if topic is None else topic
    source_host = host or socket.gethostname()
    if producer is None:
        producer = _connect(broker, topic, kafka_config, connect_timeout_s)

    stats = SamplerStats()
    last_warning = [-math.inf]

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is None:
            stats.delivered += 1
            return
        stats.failed += 1
        stats.last_error = str(err)
        if time.monotonic() - last_warning[0] >= _WARN_EVERY_S:
            last_warning[0] = time.monotonic()
            _log.warning("GPU sample not delivered to %s: %s", topic, err)

    def send(sample: GpuSample) -> None:
        key, value, headers = message_of(sample, source_host)
        for attempt in (1, 2):
            try:
                producer.produce(
                    topic, value=value, key=key, headers=headers, on_delivery=on_delivery
                )
            except BufferError:  # local queue full: serve delivery reports, retry once
                if attempt == 1:
                    producer.poll(0.5)
                    continue
                stats.dropped += 1
                stats.last_error = "local producer queue full"
                return
            stats.samples += 1
            return

    stop = _Stop()
    started = time.monotonic()
    next_tick = started
    try:
        with _signals(stop, handle_signals):
            while stop.signal is None:
                for sample in reader.sample(time.time_ns() // 1_000_000):
                    send(sample)
                stats.rounds += 1
                producer.poll(0)
                stats.elapsed_s = time.monotonic() - started
                if on_round is not None:
                    on_round(stats)
                if count is not None and stats.rounds >= count:
                    break
                next_tick += interval_s
                now = time.monotonic()
                if next_tick < now:  # overran: skip the missed ticks
                    next_tick += math.ceil((now - next_tick) / interval_s) * interval_s
                while stop.signal is None and (left := next_tick - time.monotonic()) > 0:
                    time.sleep(min(left, _WAIT_SLICE_S))
                    producer.poll(0)
            stats.stopped_by = stop.signal
    except KeyboardInterrupt:
        stats.stopped_by = "SIGINT"
    finally:
        queued = producer.flush(flush_timeout_s)
        if queued:
            stats.failed += queued
            stats.last_error = (
                f"{queued} sample(s) still queued after a {flush_timeout_s:g} s flush"
            )
        stats.elapsed_s = time.monotonic() - started
    return stats
