"""Every knob of the capacity agent, and how ``TAILGUARD_CAPACITY`` sets them."""

import json
from dataclasses import dataclass, field
from typing import Any

from tailguard.streams.breaker import BreakerPolicy
from tailguard.streams.capacity import ScalePolicy
from tailguard.streams.knee import KneeConfig
from tailguard.streams.rag import RagConfig

__all__ = ["CapacityTuning"]


@dataclass(frozen=True, slots=True)
class CapacityTuning:
    """Every knob of the capacity agent (defaults: docs/capacity.md)."""

    interval_ms: int = 10_000
    grace_ms: int = 2_000
    knee: KneeConfig = field(default_factory=KneeConfig)
    scale: ScalePolicy = field(default_factory=ScalePolicy)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    rag: RagConfig = field(default_factory=RagConfig)
    warmup_after: int = 20

    @classmethod
    def from_json(cls, text: str) -> "CapacityTuning":
        """From ``TAILGUARD_CAPACITY`` JSON: {"interval_ms":…, "knee":{…}, "scale":{…}, …}."""
        raw = json.loads(text) if text else {}
        parts = {
            "knee": KneeConfig,
            "scale": ScalePolicy,
            "breaker": BreakerPolicy,
            "rag": RagConfig,
        }
        kw: dict[str, Any] = {k: parts[k](**v) for k, v in raw.items() if k in parts}
        kw.update({k: v for k, v in raw.items() if k not in parts})
        return cls(**kw)
