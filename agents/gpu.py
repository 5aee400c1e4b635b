"""GPU telemetry: the latest NVML sample per GPU, in a table and in every worker's join cache.

- The GPU agent validates ``tailguard.gpu`` (dead-lettering bad samples) and
  keeps the latest sample per ``host:gpu`` in a RocksDB table (changelogged,
  partitioned like the topic).
- Every worker needs *every* GPU's latest sample for the breach join (a
  series owned here may run on GPUs whose telemetry partition is owned
  elsewhere). A faust ``GlobalTable`` would replicate the table, but with
  faust-streaming 0.15 a worker restarted after a crash stopped consuming its
  input partitions when a global table was present (reproduced by
  ``tests/integration/test_sli_pipeline.py::test_worker_killed_mid_stream…``).
  So each worker instead runs a :class:`GpuCache`: a small confluent-kafka
  consumer outside the consumer group that reads all partitions of
  ``tailguard.gpu`` from a few minutes back and keeps the newest sample per GPU.
"""

import threading
import time
from typing import Any

import faust
import msgspec
from tailguard.agents.deadletters import decode_or_dead_letter
from tailguard.agents.settings import Settings
from tailguard.agents.stats import WorkerStats
from tailguard.agents.topics import Topics
from tailguard.schemas import GpuSample

__all__ = ["GpuCache", "declare_gpu_table", "gpu_join", "gpu_key", "register_gpu"]

_decode_sample = msgspec.json.Decoder(GpuSample).decode
_encode = msgspec.json.Encoder().encode


def gpu_key(host: str, gpu: int) -> str:
    """Key of one GPU: ``host:gpu`` (the telemetry topic's key too)."""
    return f"{host}:{gpu}"


def declare_gpu_table(app: faust.App, settings: Settings) -> Any:
    return app.Table(
        "tailguard-gpu-latest",
        default=None,
        partitions=settings.partitions,
        key_type=bytes,
        value_type=bytes,
        options=settings.rocksdb_options(),
        help="latest NVML sample per host:gpu",
    )


class GpuCache:
    """Newest sample per ``host:gpu`` key, from every partition of the GPU topic.

    ``get(key)`` returns the encoded sample (the same interface as the table,
    so :func:`gpu_join` reads either).
    """

    def __init__(self, broker: str, topic: str, lookback_s: float = 600.0) -> None:
        self._broker = broker
        self._topic = topic
        self._lookback_ms = int(lookback_s * 1000)
        self._latest: dict[bytes, tuple[int, bytes]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def get(self, key: bytes) -> bytes | None:
        entry = self._latest.get(key)
        return None if entry is None else entry[1]

    def offer(self, key: bytes, raw: bytes) -> None:
        """Keep ``raw`` if it decodes and is newer than what is held for ``key``."""
        try:
            sample = _decode_sample(raw)
        except msgspec.ValidationError:
            return
        except msgspec.DecodeError:
            return
        held = self._latest.get(key)
        if held is None or sample.ts_ms >= held[0]:
            self._latest[key] = (sample.ts_ms, raw)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tailguard-gpu-cache", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self._broker,
                "group.id": "tailguard-gpu-cache",  # never joined: partitions are assigned
                "enable.auto.commit": False,
                "enable.partition.eof": False,
            }
        )
        try:
            while not self._stop.is_set():
                try:
                    meta = consumer.list_topics(self._topic, timeout=5).topics.get(self._topic)
                except KafkaException:
                    self._stop.wait(2)
                    continue
                if meta is None or meta.error is not None or not meta.partitions:
                    self._stop.wait(2)
                    continue
                since = int(time.time() * 1000) - self._lookback_ms
                wanted = [TopicPartition(self._topic, p, since) for p in meta.partitions]
                consumer.assign(consumer.offsets_for_times(wanted, timeout=10))
                break
            while not self._stop.is_set():
                for msg in consumer.consume(500, timeout=0.5):
                    if msg.error() is None and msg.key() and msg.value():
                        self.offer(msg.key(), msg.value())
        finally:
            consumer.close()


def register_gpu(
    app: faust.App, topics: Topics, settings: Settings, stats: WorkerStats, table: Any
) -> Any:
    """Attach the GPU telemetry agent."""

    @app.agent(topics.gpu, name="tailguard.gpu")
    async def gpu(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            valid = await decode_or_dead_letter(
                event, "gpu", topic=topics.deadletter, stats=stats, source=settings.source
            )
            for sample in valid:
                key = gpu_key(sample.host, sample.gpu).encode()
                old = table.get(key)
                if old is not None and _decode_sample(old).ts_ms > sample.ts_ms:
                    continue  # an older sample arriving late never replaces a newer one
                table[key] = _encode(sample)
                stats.gpu_samples += 1

    return gpu


def gpu_join(table: Any, gpus: list[tuple[str, int]], now_ms: int) -> list[dict[str, Any]]:
    # ``table``: anything with ``get(key: bytes) -> bytes | None`` (GpuCache, a dict).
    """The latest sample of each GPU with its age; ``{"host","gpu","known": False}`` when none."""
    joined: list[dict[str, Any]] = []
    for host, index in gpus:
        raw = table.get(gpu_key(host, index).encode())
        if raw is None:
            joined.append({"host": host, "gpu": index, "known": False})
            continue
        sample = msgspec.to_builtins(_decode_sample(raw))
        sample.pop("schema", None)
        sample["known"] = True
        sample["age_ms"] = max(0, now_ms - sample["ts_ms"])
        joined.append(sample)
    return joined
