"""Tenant interference: the detector's policy, its state per deployment and what it reports.

See :mod:`~tailguard.streams.interference` for what the detector judges and why.
"""

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from tailguard.streams.errors import ConfigError, CorruptStateError

__all__ = [
    "KIND",
    "METRICS",
    "Baseline",
    "DeploymentState",
    "Gate",
    "InterferencePolicy",
    "InterferenceTransition",
    "Severity",
    "TransitionState",
    "VictimState",
    "interference_breach_id",
]


KIND = "interference"
#: Latency metrics read from the SLI points (their P99s).
METRICS: tuple[str, ...] = ("ttft_ms", "itl_ms", "e2e_ms")
Severity = Literal["page", "ticket"]
#: How :func:`offer` may evaluate: not yet, complete minutes only, or without stalled series.
Gate = Literal["hold", "wait", "force"]
TransitionState = Literal["opened", "updated", "resolved"]
_WIRE_VERSION = 1


@dataclass(frozen=True, slots=True)
class InterferencePolicy:
    """Thresholds of the detector (minutes are event-time minutes)."""

    baseline_minutes: int = 30
    #: Minutes with points the victim needs in its baseline before it is judged.
    min_baseline_points: int = 10
    #: Requests per minute a victim (and a neighbour) needs in the judged minute.
    min_requests: int = 30
    #: P99 over its baseline median that counts as jitter (any trigger metric).
    jitter_ratio: float = 1.5
    trigger_metrics: tuple[str, ...] = ("ttft_ms", "itl_ms")
    #: The victim's own load over its baseline must stay at or below this.
    own_load_max: float = 1.25
    #: A neighbour's load over its baseline must reach this.
    neighbour_load_min: float = 1.5
    #: Minimum rise of an instance's fragmentation over its baseline (absolute).
    frag_rise_min: float = 0.05
    #: KV minutes read as "now": (E − kv_minutes, E].
    kv_minutes: int = 3
    #: Without KV evidence (no affected shared instance) nobody is a neighbour.
    require_kv: bool = True
    persist_minutes: int = 3
    resolve_minutes: int = 3
    update_interval_minutes: int = 5
    material_change: float = 0.25
    page_below_compliance: float = 0.99
    correlation_minutes: int = 30
    stall_minutes: int = 10
    #: Minutes of points kept per series (≥ the longest window read).
    history_minutes: int = 45

    def __post_init__(self) -> None:
        for name in (
            "baseline_minutes",
            "min_baseline_points",
            "kv_minutes",
            "persist_minutes",
            "resolve_minutes",
            "correlation_minutes",
            "stall_minutes",
            "history_minutes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"{name} must be an integer ≥ 1, got {value!r}"
                raise ConfigError(msg)
        if self.update_interval_minutes < 0 or self.min_requests < 0:
            msg = "update_interval_minutes and min_requests must be ≥ 0"
            raise ConfigError(msg)
        if self.min_baseline_points > self.baseline_minutes:
            msg = (
                f"min_baseline_points ({self.min_baseline_points}) cannot exceed "
                f"baseline_minutes ({self.baseline_minutes})"
            )
            raise ConfigError(msg)
        longest = max(self.baseline_minutes, self.correlation_minutes) + self.stall_minutes
        if self.history_minutes < longest:
            msg = (
                f"history_minutes ({self.history_minutes}) must cover the baseline or "
                f"correlation window plus stall_minutes ({longest})"
            )
            raise ConfigError(msg)
        if not self.jitter_ratio > 1 or not self.neighbour_load_min > 1:
            msg = "jitter_ratio and neighbour_load_min must be > 1 (ratios over a baseline)"
            raise ConfigError(msg)
        if not self.own_load_max > 0 or not self.material_change > 0:
            msg = "own_load_max and material_change must be > 0"
            raise ConfigError(msg)
        if not 0 <= self.frag_rise_min < 1 or not 0 < self.page_below_compliance <= 1:
            msg = "frag_rise_min must be in [0, 1) and page_below_compliance in (0, 1]"
            raise ConfigError(msg)
        unknown = [m for m in self.trigger_metrics if m not in METRICS]
        if unknown or not self.trigger_metrics:
            msg = f"trigger_metrics must be a non-empty subset of {METRICS}, got {unknown}"
            raise ConfigError(msg)


class Baseline(msgspec.Struct, array_like=True):
    """A victim's baseline over ``[from_ms, to_ms)``; frozen while its episode lasts."""

    from_ms: int
    to_ms: int
    points: int
    p99: dict[str, float]
    #: Every tenant's median request rate (requests/s) over the baseline.
    rates: dict[str, float]
    #: Instance → token-weighted fragmentation over the baseline (filled as instances are met).
    frag: dict[str, float] = {}


class VictimState(msgspec.Struct):
    """Episode and breach of one (deployment, victim)."""

    streak: int = 0
    anchor_ms: int | None = None
    baseline: Baseline | None = None
    breach_id: str | None = None
    opened_ms: int | None = None
    seq: int = 0
    severity: str | None = None
    slo: str | None = None
    variant: str | None = None
    quiet: int = 0
    neighbours: list[str] = []
    shares: list[float] = []
    last_emit_ms: int | None = None
    emitted_jitter: float = 0.0

    @property
    def is_open(self) -> bool:
        return self.breach_id is not None


class DeploymentState(msgspec.Struct):
    """Detector state of one deployment: its series' progress and its victims."""

    service: str
    model: str
    #: ``variant|tenant`` → end of the newest minute that series reported.
    series: dict[str, int] = {}
    evaluated_ms: int | None = None
    first_ms: int | None = None
    victims: dict[str, VictimState] = {}

    @property
    def key(self) -> str:
        return f"{self.service}|{self.model}"

    def note(self, variant: str, tenant: str, end_ms: int) -> bool:
        """Record that a series reported ``end_ms``; False when that minute was evaluated."""
        skey = f"{variant}|{tenant}"
        if end_ms > self.series.get(skey, -1):
            self.series[skey] = end_ms
        if self.first_ms is None or end_ms < self.first_ms:
            self.first_ms = end_ms
        return self.evaluated_ms is None or end_ms > self.evaluated_ms

    def to_bytes(self) -> bytes:
        return msgspec.msgpack.encode((_WIRE_VERSION, self))

    @classmethod
    def from_bytes(cls, data: bytes) -> "DeploymentState":
        try:
            version, state = msgspec.msgpack.decode(data, type=tuple[int, DeploymentState])
            if version != _WIRE_VERSION:
                msg = f"state version {version}, this code reads {_WIRE_VERSION}"
                raise ValueError(msg)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            msg = (
                f"interference state does not decode ({exc}); delete the worker data dir "
                "and let it restore from the changelog"
            )
            raise CorruptStateError(msg) from exc
        return state


def interference_breach_id(service: str, model: str, victim: str, opened_ms: int) -> str:
    """Stable id of the interference breach of ``victim`` that opened at ``opened_ms``."""
    text = f"{service}|{model}\x1f{victim}\x1f{KIND}\x1f{opened_ms}".encode()
    return hashlib.blake2b(text, digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class InterferenceTransition:
    """One lifecycle event of an interference breach (a ``tailguard.breach.v1`` body)."""

    state: TransitionState
    breach_id: str
    seq: int
    at_ms: int
    service: str
    model: str
    victim: str
    #: The victim's variant, or ``"*"`` when its traffic spans several.
    variant: str
    severity: Severity
    slo: str
    opened_ms: int
    resolved_ms: int | None
    evidence: Mapping[str, Any]
    attribution: tuple[Mapping[str, Any], ...]
    exemplars: tuple[str, ...] = ()
    reason: str | None = None

    @property
    def event_id(self) -> str:
        return f"{self.breach_id}:{self.seq}"

    @property
    def series(self) -> tuple[str, str, str, str]:
        return self.service, self.model, self.variant, self.victim
