"""The port every GPU telemetry source implements.

:class:`~tailguard.gpu.nvml.NvmlReader` reads real GPUs through NVML;
:class:`~tailguard.gpu.simulate.SimulatedReader` makes plausible telemetry for
demos and tests. :func:`tailguard.gpu.sampler.run` takes either.
"""

from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from tailguard.schemas import GpuSample

__all__ = ["GpuReader", "ReaderStats"]


@dataclass(slots=True)
class ReaderStats:
    """What the reader saw so far.

    ``skipped`` counts, per GPU index, the rounds a GPU was skipped because a
    read failed; ``lost`` maps each dropped GPU index to the reason.
    """

    rounds: int = 0
    samples: int = 0
    skipped: dict[int, int] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)
    xid_events: int = 0
    failed_rounds: int = 0


@runtime_checkable
class GpuReader(Protocol):
    """A source of ``tailguard.gpu.v1`` samples, one per GPU per call."""

    stats: ReaderStats

    def sample(self, now_ms: int) -> list[GpuSample]:
        """One sample of every GPU the reader still sees, stamped ``ts_ms = now_ms``."""
        ...

    def close(self) -> None:
        """Release what the reader holds (idempotent)."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
