"""Per-request SLI definitions: what a request contributes, and the thresholds it is held to.

Definitions follow vLLM's ``bench serve``:

- TTFT  = ``ttft_ms``
- TPOT  = (e2e_ms − ttft_ms) / (output_tokens − 1), for output_tokens > 1
- ITL   = every element of ``itl_ms`` (per-gap, not per-request)
- E2E   = ``e2e_ms``

Compliance counters are exact (integers), percentiles come from digests:

- ``ttft_good / ttft_total``  share of requests with TTFT ≤ ``ttft_ms``
- ``itl_good / itl_total``    share of gaps with ITL ≤ ``itl_ms``
- composite SLI = 0.7 · TTFT compliance + 0.3 · ITL compliance (the article's weights)
- a request is *good* for goodput (DistServe; vLLM ``--goodput``) when it succeeded
  and met every latency threshold of its series: TTFT ≤ ``ttft_ms``,
  TPOT ≤ ``itl_ms`` (its mean gap) and, when set, E2E ≤ ``e2e_ms``.
"""

from dataclasses import dataclass
from typing import Protocol

from tailguard.streams.errors import ConfigError

__all__ = ["LatencyEvent", "Thresholds", "tpot_ms"]


class LatencyEvent(Protocol):
    """What the window state reads of an inference event (``InferenceEvent`` fits)."""

    @property
    def event_id(self) -> str: ...
    @property
    def ts_ms(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def e2e_ms(self) -> float: ...
    @property
    def ttft_ms(self) -> float | None: ...
    @property
    def output_tokens(self) -> int | None: ...
    @property
    def itl_ms(self) -> list[float] | None: ...
    @property
    def trace_id(self) -> str | None: ...
    @property
    def warmup(self) -> bool | None: ...


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Latency thresholds of one series (defaults: those of the default SLOs)."""

    ttft_ms: float = 800.0
    itl_ms: float = 120.0
    e2e_ms: float | None = None
    ttft_weight: float = 0.7
    itl_weight: float = 0.3

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "itl_ms"):
            value = getattr(self, name)
            if not value > 0:
                msg = f"threshold {name} must be > 0 ms, got {value!r}"
                raise ConfigError(msg)
        if self.e2e_ms is not None and not self.e2e_ms > 0:
            msg = f"threshold e2e_ms must be > 0 ms or None, got {self.e2e_ms!r}"
            raise ConfigError(msg)
        for name in ("ttft_weight", "itl_weight"):
            weight = getattr(self, name)
            if not 0.0 <= weight <= 1.0:  # also refuses NaN
                msg = f"composite weight {name} must be in [0, 1], got {weight!r}"
                raise ConfigError(msg)
        if abs(self.ttft_weight + self.itl_weight - 1.0) > 1e-9:
            msg = (
                f"composite weights must sum to 1, got ttft {self.ttft_weight} "
                f"+ itl {self.itl_weight}"
            )
            raise ConfigError(msg)


def tpot_ms(e2e_ms: float, ttft_ms: float | None, output_tokens: int | None) -> float | None:
    """Time per output token after the first, or ``None`` when undefined."""
    if ttft_ms is None or output_tokens is None or output_tokens <= 1:
        return None
    return (e2e_ms - ttft_ms) / (output_tokens - 1)
