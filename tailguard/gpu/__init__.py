"""GPU telemetry for tailguard: NVML (or simulated) samples → ``tailguard.gpu``.

- :mod:`~tailguard.gpu.reader`    the :class:`GpuReader` port, :class:`ReaderStats`
- :mod:`~tailguard.gpu.nvml`      :class:`NvmlReader`: real GPUs through ``pynvml``
- :mod:`~tailguard.gpu.simulate`  :class:`SimulatedReader`: a deterministic demo fleet
- :mod:`~tailguard.gpu.throttle`  NVML clock-throttle bitmask ↔ reason names
- :mod:`~tailguard.gpu.sampler`   :func:`run`: a reader → Kafka, every interval
- :mod:`~tailguard.gpu.cli`       the ``tailguard gpu-sampler`` command
- :mod:`~tailguard.gpu.errors`    the error tree

Importing this package loads neither ``pynvml`` nor ``confluent_kafka``; each
is imported when first needed.

Example::

    from tailguard.gpu import SimulatedReader, run

    reader = SimulatedReader(hosts=2, gpus_per_host=8, seed=7,
                             pressure=[("gpu-node-01", 60, 240)])
    run(reader, broker="localhost:9092", interval_s=1.0, count=300)
"""

from tailguard.gpu.errors import (
    BrokerError,
    GpuConfigError,
    GpuSamplerError,
    NoGpuTelemetry,
    NoNvidiaDriver,
    NoNvidiaGpu,
    NvmlError,
)
from tailguard.gpu.nvml import NvmlReader
from tailguard.gpu.reader import GpuReader, ReaderStats
from tailguard.gpu.sampler import (
    GPU_TOPIC,
    JsonLinesProducer,
    ProducerPort,
    SamplerStats,
    default_topic,
    run,
)
from tailguard.gpu.simulate import Pressure, SimulatedReader, XidEvent
from tailguard.gpu.throttle import THROTTLE_REASONS, decode_throttle_reasons

__all__ = [
    "GPU_TOPIC",
    "THROTTLE_REASONS",
    "BrokerError",
    "GpuConfigError",
    "GpuReader",
    "GpuSamplerError",
    "JsonLinesProducer",
    "NoGpuTelemetry",
    "NoNvidiaDriver",
    "NoNvidiaGpu",
    "NvmlError",
    "NvmlReader",
    "Pressure",
    "ProducerPort",
    "ReaderStats",
    "SamplerStats",
    "SimulatedReader",
    "XidEvent",
    "decode_throttle_reasons",
    "default_topic",
    "run",
]
