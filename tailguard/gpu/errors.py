"""Errors of the GPU sampler.

::

    TailguardError (Exception)
    ├── GpuConfigError (TailguardError, ValueError)     a reader/sampler argument is invalid
    │                                                   (--pressure spec, GPU count, interval)
    └── GpuSamplerError (TailguardError, RuntimeError)  the sampler could not run
        ├── NoGpuTelemetry                              nothing to sample on this machine
        │   ├── NoNvidiaDriver                          no NVML library / driver (exit 3)
        │   └── NoNvidiaGpu                             NVML runs but sees no GPU (exit 3)
        ├── NvmlError                                   NVML failed otherwise (permissions,
        │                                               version mismatch, every GPU lost)
        └── BrokerError                                 Kafka unreachable or topic missing

Every message is one line that says what was wrong and what to do about it.
"""

from tailguard.errors import TailguardError

__all__ = [
    "BrokerError",
    "GpuConfigError",
    "GpuSamplerError",
    "NoGpuTelemetry",
    "NoNvidiaDriver",
    "NoNvidiaGpu",
    "NvmlError",
]


class GpuConfigError(TailguardError, ValueError):
    """An argument of a GPU reader or of the sampler is invalid."""


class GpuSamplerError(TailguardError, RuntimeError):
    """The GPU sampler could not run."""


class NoGpuTelemetry(GpuSamplerError):
    """There is nothing to sample on this machine (the CLI exits with status 3)."""


class NoNvidiaDriver(NoGpuTelemetry):
    """NVML cannot be loaded: no NVIDIA driver, no ``libnvidia-ml``, or no ``pynvml``."""


class NoNvidiaGpu(NoGpuTelemetry):
    """NVML started but reports no GPU."""


class NvmlError(GpuSamplerError):
    """NVML failed in a way that stops sampling (permissions, version mismatch, all GPUs lost)."""


class BrokerError(GpuSamplerError):
    """The Kafka broker cannot be reached, or the GPU topic does not exist."""
