"""An objective and the series it holds for: what an SLO says, before any burn rate.

An SLO says "``target`` of the eligible events of ``sli`` are good over a
rolling period" (30 days by default) for the series its selector matches;
latency SLIs name the threshold (ms) an event must not exceed. Counters are
counted at ingest against one set of thresholds per series, so every SLO of
a series must agree on each threshold (:func:`thresholds_for`). How fast an
SLO spends its budget and when that pages is :mod:`~tailguard.streams.burn`.
"""

import functools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from tailguard.streams.errors import ConfigError
from tailguard.streams.selector import Selector
from tailguard.streams.sli import Thresholds

__all__ = [
    "LATENCY_SLIS",
    "SLIS",
    "SLO_PERIOD_MS",
    "SloSpec",
    "applicable",
    "compared_values",
    "thresholds_for",
    "window_ms",
]

#: Latency SLIs: the SLO names a threshold in ms; events at or below it are good.
LATENCY_SLIS = ("ttft_ms", "itl_ms", "e2e_ms")
#: Every SLI an SLO may hold (:mod:`~tailguard.streams.burn` says what each counts).
SLIS = (*LATENCY_SLIS, "success", "goodput", "composite")

_MINUTE_MS = 60_000
_DAY_MS = 86_400_000
#: The SLO period the default burn rates are written for.
SLO_PERIOD_MS = 30 * _DAY_MS
_UNITS = {"s": 1_000, "m": _MINUTE_MS, "h": 3_600_000, "d": _DAY_MS, "w": 7 * _DAY_MS}
_DURATION = re.compile(r"([1-9][0-9]*)([smhdw])")


@functools.lru_cache(maxsize=1024)
def window_ms(name: str) -> int:
    """Milliseconds of a window name such as ``5m``, ``2h``, ``3d`` or ``30d``.

    Remembered (an SLO evaluation reads it for every window, several times)."""
    match = _DURATION.fullmatch(name)
    if match is None:
        msg = f"window {name!r} is not <positive integer><s|m|h|d|w>, e.g. '5m', '2h', '30d'"
        raise ConfigError(msg)
    return int(match.group(1)) * _UNITS[match.group(2)]


# ------------------------------------------------------------------ the SLO


def compared_values(obj: Any) -> tuple[Any, ...]:
    """The values a dataclass's equality compares, in field order."""
    return tuple(getattr(obj, f.name) for f in fields(obj) if f.compare)


@dataclass(frozen=True, slots=True)
class SloSpec:
    """One objective: ``target`` of the events of ``sli`` are good over ``window_ms``.

    ``ttft_ms`` / ``itl_ms`` / ``e2e_ms`` are the latency thresholds the SLO
    holds (a latency SLI needs its own; ``composite`` and ``goodput`` may name
    theirs). ``itl_ms`` is also the TPOT threshold of ``goodput``, as in
    :class:`~tailguard.streams.sli.Thresholds`. ``op`` is informational
    (``lte`` or ``lt``): counters count ``value ≤ threshold``, which differs
    from ``<`` only for a value exactly equal to the threshold.
    """

    name: str
    sli: str
    target: float
    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None
    ttft_weight: float = 0.7
    itl_weight: float = 0.3
    window_ms: int = SLO_PERIOD_MS
    selector: Selector = field(default_factory=Selector)
    op: str = "lte"
    display_name: str = ""
    description: str = ""
    #: Where the definition came from (``file:line``), for messages; not part of equality.
    source: str = field(default="", compare=False)
    #: The hash, worked out once: a minute's close looks every SLO of a series up
    #: in caches keyed by it, and a dataclass would hash every field each time.
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        return self._hash

    def __post_init__(self) -> None:
        where = f"SLO {self.name!r}" + (f" ({self.source})" if self.source else "")
        if not self.name:
            msg = f"SLO name must be non-empty{' (' + self.source + ')' if self.source else ''}"
            raise ConfigError(msg)
        if self.sli not in SLIS:
            msg = f"{where}: unknown SLI {self.sli!r}; choose one of {', '.join(SLIS)}"
            raise ConfigError(msg)
        if not 0.0 < self.target < 1.0:  # also refuses NaN
            msg = (
                f"{where}: target must be in (0, 1), got {self.target!r} "
                "(1 leaves no error budget to burn)"
            )
            raise ConfigError(msg)
        for name in ("ttft_ms", "itl_ms", "e2e_ms"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                msg = f"{where}: threshold {name} must be a finite number > 0 ms, got {value!r}"
                raise ConfigError(msg)
        if self.sli in LATENCY_SLIS and getattr(self, self.sli) is None:
            msg = f"{where}: a {self.sli} SLO needs its threshold {self.sli}"
            raise ConfigError(msg)
        for name in ("ttft_weight", "itl_weight"):
            weight = getattr(self, name)
            if not 0.0 <= weight <= 1.0:
                msg = f"{where}: {name} must be in [0, 1], got {weight!r}"
                raise ConfigError(msg)
        if abs(self.ttft_weight + self.itl_weight - 1.0) > 1e-9:
            msg = (
                f"{where}: composite weights must sum to 1, "
                f"got {self.ttft_weight} + {self.itl_weight}"
            )
            raise ConfigError(msg)
        if self.window_ms <= 0:
            msg = f"{where}: window_ms must be > 0, got {self.window_ms}"
            raise ConfigError(msg)
        if self.op not in ("lte", "lt"):
            msg = f"{where}: op must be 'lte' or 'lt', got {self.op!r}"
            raise ConfigError(msg)
        object.__setattr__(self, "_hash", hash(compared_values(self)))

    @property
    def budget(self) -> float:
        """The error budget ``1 − target``, to 12 digits (1 − 0.99 is 0.01, not 0.010…09)."""
        return round(1.0 - self.target, 12)

    @property
    def threshold_ms(self) -> float | None:
        """The latency threshold of a latency SLI, else ``None``."""
        return getattr(self, self.sli) if self.sli in LATENCY_SLIS else None

    def applies_to(
        self, service: str, model: str, variant: str = "default", tenant: str = "default"
    ) -> bool:
        return self.selector.matches(service, model, variant, tenant)


def applicable(
    specs: Iterable[SloSpec],
    service: str,
    model: str,
    variant: str = "default",
    tenant: str = "default",
) -> tuple[SloSpec, ...]:
    """The SLOs whose selector matches a series, in the given order."""
    return tuple(s for s in specs if s.applies_to(service, model, variant, tenant))


def thresholds_for(specs: Iterable[SloSpec], base: Thresholds | None = None) -> Thresholds:
    """The ingest thresholds a series must be counted against for these SLOs to hold.

    Counters are counted at ingest against *one* ``Thresholds`` per series, so
    every SLO applying to a series must agree on each threshold (and the
    composites on their weights); values no SLO names come from ``base``.
    Two SLOs asking for different values raise ``ConfigError`` naming both.
    """
    base = base or Thresholds()
    chosen: dict[str, tuple[float, str]] = {}
    for spec in specs:
        values: dict[str, float | None] = {
            "ttft_ms": spec.ttft_ms,
            "itl_ms": spec.itl_ms,
            "e2e_ms": spec.e2e_ms,
        }
        if spec.sli == "composite":
            values["ttft_weight"] = spec.ttft_weight
            values["itl_weight"] = spec.itl_weight
        for name, value in values.items():
            if value is None:
                continue
            seen = chosen.get(name)
            if seen is not None and seen[0] != value:
                msg = (
                    f"SLOs {seen[1]!r} and {spec.name!r} apply to the same series but ask for "
                    f"{name} {seen[0]:g} and {value:g}; a series counts one threshold per SLI, "
                    "so narrow one selector or align the thresholds"
                )
                raise ConfigError(msg)
            chosen[name] = (value, spec.name)
    return Thresholds(
        ttft_ms=chosen["ttft_ms"][0] if "ttft_ms" in chosen else base.ttft_ms,
        itl_ms=chosen["itl_ms"][0] if "itl_ms" in chosen else base.itl_ms,
        e2e_ms=chosen["e2e_ms"][0] if "e2e_ms" in chosen else base.e2e_ms,
        ttft_weight=chosen["ttft_weight"][0] if "ttft_weight" in chosen else base.ttft_weight,
        itl_weight=chosen["itl_weight"][0] if "itl_weight" in chosen else base.itl_weight,
    )
