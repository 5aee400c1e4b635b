"""GPU agent: the latest NVML sample per GPU, in a RocksDB-backed global table.

Every worker needs every GPU's latest sample (a breach on a series owned here
joins the GPUs that served it, wherever their telemetry partition lives), so
the table is a faust ``GlobalTable``: one changelog partition (the documented
workaround for global-table recovery loops), replicated to every worker.
Telemetry is small — one sample per GPU per interval — so that is cheap.
"""

import time
from typing import Any

import faust
import msgspec
from tailguard.agents.deadletters import send_rejects
from tailguard.agents.settings import Settings
from tailguard.agents.stats import WorkerStats
from tailguard.agents.topics import Topics
from tailguard.schemas import GpuSample, decode

__all__ = ["declare_gpu_table", "gpu_join", "gpu_key", "register_gpu"]

_decode_sample = msgspec.json.Decoder(GpuSample).decode
_encode = msgspec.json.Encoder().encode


def gpu_key(host: str, gpu: int) -> str:
    """Key of one GPU: ``host:gpu`` (the telemetry topic's key too)."""
    return f"{host}:{gpu}"


def declare_gpu_table(app: faust.App, settings: Settings) -> Any:
    return app.GlobalTable(
        "tailguard-gpu-latest",
        default=None,
        partitions=1,
        recovery_buffer_size=1,
        use_partitioner=True,
        key_type=bytes,
        value_type=bytes,
        options=settings.rocksdb_options(),
        help="latest NVML sample per host:gpu",
    )


def register_gpu(
    app: faust.App, topics: Topics, settings: Settings, stats: WorkerStats, table: Any
) -> Any:
    """Attach the GPU telemetry agent."""

    @app.agent(topics.gpu, name="tailguard.gpu")
    async def gpu(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            now = int(time.time() * 1000)
            decoded = decode(event.value, "gpu", now_ms=now)
            if decoded.rejects:
                await send_rejects(
                    decoded.rejects,
                    event.value,
                    event.message,
                    topic=topics.deadletter,
                    stats=stats,
                    source=settings.source,
                    now_ms=now,
                )
            for sample in decoded.valid:
                key = gpu_key(sample.host, sample.gpu).encode()
                old = table.get(key)
                if old is not None and _decode_sample(old).ts_ms > sample.ts_ms:
                    continue  # an older sample arriving late never replaces a newer one
                table[key] = _encode(sample)
                stats.gpu_samples += 1

    return gpu


def gpu_join(table: Any, gpus: list[tuple[str, int]], now_ms: int) -> list[dict[str, Any]]:
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
