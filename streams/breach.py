"""Breach lifecycle of one (series, SLO): ``opened`` → ``updated``* → ``resolved``.

Fed with the :class:`~tailguard.streams.burn.Verdict` of each evaluation point
(event time, e.g. every closed minute), :func:`advance` returns the new state
and the transitions to publish on ``tailguard.breaches``::

    event time ─────────────────────────────────────────────────────────────────▶
    verdict      · · T T P P P P P T T · · · · · · · · T · · ·        (· none, T ticket, P page)
    transitions      ▲   ▲               ▲                     ▲
                  opened updated      updated               resolved
                  ticket (severity:   (severity: page       (nothing fired
                         page, at     not seen for          for resolve_hold)
                         once)        resolve_hold)
                         └─ rate changes in between: "updated" only when material
                            and ≥ update_interval after the last transition

Rules (all in event time, so replaying the evaluations replays the transitions):

- **opened** once, at the first evaluation where a rule fires (``Verdict.severity``
  is set; a rule held back by the traffic gate does not count).
- **updated** when the breach's severity changes, or when any burn rate has
  moved materially since the last transition — ``|r − r₀| ≥ material_change ·
  max(r₀, rate_floor)`` — while a rule fires and at least ``update_interval_ms``
  after the last transition. Escalation (ticket → page) is immediate;
  de-escalation (page → ticket) waits until no page rule has fired for
  ``resolve_hold_ms``, the same hold that guards resolution, so the severity
  does not flap.
- **resolved** once, at the first evaluation at least ``resolve_hold_ms`` after
  the last one at which any rule fired.
- An evaluation point not later than the last one seen is ignored (no
  transitions): re-evaluating a minute after a restart is harmless.

``breach_id`` is derived from the series key, the SLO name and the event time
it opened (BLAKE2b), so a replay names its breaches the same; each transition
has ``event_id = breach_id:seq``. The state is a small value that serialises
to bytes (msgpack) for a table and restores from them.
"""

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import msgspec
from tailguard.streams.burn import SEVERITIES, Severity, Verdict
from tailguard.streams.errors import ConfigError, CorruptStateError

__all__ = [
    "BreachPolicy",
    "BreachState",
    "Transition",
    "TransitionState",
    "UpdateReason",
    "advance",
    "breach_id",
    "replay",
]

TransitionState = Literal["opened", "updated", "resolved"]
UpdateReason = Literal["severity", "burn_rate"]
_MINUTE_MS = 60_000
_WIRE_VERSION = 1


@dataclass(frozen=True, slots=True)
class BreachPolicy:
    """Hysteresis of the lifecycle (event-time milliseconds)."""

    #: Resolve (and de-escalate) only after this long without a firing rule.
    resolve_hold_ms: int = 5 * _MINUTE_MS
    #: Burn-rate-only updates no more often than this.
    update_interval_ms: int = 5 * _MINUTE_MS
    #: Relative change of a burn rate that is worth an update.
    material_change: float = 0.25
    #: Rates below this are compared as if they were this (0.1 → 0.2 is not news).
    rate_floor: float = 1.0

    def __post_init__(self) -> None:
        for name in ("resolve_hold_ms", "update_interval_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                msg = f"{name} must be an integer number of ms ≥ 0, got {value!r}"
                raise ConfigError(msg)
        if not self.material_change > 0:
            msg = f"material_change must be > 0 (e.g. 0.25 for 25 %), got {self.material_change!r}"
            raise ConfigError(msg)
        if not self.rate_floor > 0:
            msg = f"rate_floor must be > 0, got {self.rate_floor!r}"
            raise ConfigError(msg)


def breach_id(series_key: str, slo: str, opened_ms: int) -> str:
    """Stable id of the breach of ``slo`` on ``series_key`` that opened at ``opened_ms``."""
    text = f"{series_key}\x1f{slo}\x1f{opened_ms}".encode()
    return hashlib.blake2b(text, digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class Transition:
    """One lifecycle event of a breach (the body of a ``tailguard.breach.v1`` record)."""

    state: TransitionState
    breach_id: str
    #: 0 for ``opened``, then 1, 2, … within the breach.
    seq: int
    at_ms: int
    series_key: str
    slo: str
    #: The breach's severity after this transition (its last one for ``resolved``).
    severity: Severity
    opened_ms: int
    resolved_ms: int | None
    burn_rates: Mapping[str, float]
    peak_burn_rates: Mapping[str, float]
    sli: Mapping[str, float]
    budget_remaining: float | None
    #: Names of the rules firing at ``at_ms`` (empty for ``resolved``).
    rules: tuple[str, ...]
    #: Why an ``updated`` was emitted.
    reason: UpdateReason | None = None

    @property
    def event_id(self) -> str:
        """Deterministic output event id: ``breach_id:seq``."""
        return f"{self.breach_id}:{self.seq}"


class _Wire(msgspec.Struct, array_like=True):
    version: int
    series_key: str
    slo: str
    last_at_ms: int | None
    breach_id: str | None
    opened_ms: int | None
    severity: str | None
    last_fired_ms: int | None
    last_page_ms: int | None
    last_emit_ms: int | None
    emitted_rates: dict[str, float]
    peak_burn_rates: dict[str, float]
    seq: int


@dataclass(frozen=True, slots=True)
class BreachState:
    """Lifecycle state of one (series, SLO); ``breach_id`` is set while a breach is open."""

    series_key: str
    slo: str
    #: The latest evaluation point seen (earlier or equal ones are ignored).
    last_at_ms: int | None = None
    breach_id: str | None = None
    opened_ms: int | None = None
    severity: Severity | None = None
    last_fired_ms: int | None = None
    last_page_ms: int | None = None
    last_emit_ms: int | None = None
    #: Burn rates as of the last transition (the base of "material change").
    emitted_rates: Mapping[str, float] = field(default_factory=dict)
    peak_burn_rates: Mapping[str, float] = field(default_factory=dict)
    #: seq of the last transition of the open breach.
    seq: int = 0

    @property
    def is_open(self) -> bool:
        return self.breach_id is not None

    def to_bytes(self) -> bytes:
        wire = _Wire(
            version=_WIRE_VERSION,
            series_key=self.series_key,
            slo=self.slo,
            last_at_ms=self.last_at_ms,
            breach_id=self.breach_id,
            opened_ms=self.opened_ms,
            severity=self.severity,
            last_fired_ms=self.last_fired_ms,
            last_page_ms=self.last_page_ms,
            last_emit_ms=self.last_emit_ms,
            emitted_rates=dict(self.emitted_rates),
            peak_burn_rates=dict(self.peak_burn_rates),
            seq=self.seq,
        )
        return msgspec.msgpack.encode(wire)

    @classmethod
    def from_bytes(cls, data: bytes, *, key: Any = None) -> "BreachState":
        try:
            wire = msgspec.msgpack.decode(data, type=_Wire)
            if wire.version != _WIRE_VERSION:
                msg = f"state version {wire.version}, this code reads {_WIRE_VERSION}"
                raise ValueError(msg)
            if wire.severity is not None and wire.severity not in SEVERITIES:
                msg = f"unknown severity {wire.severity!r}"
                raise ValueError(msg)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            msg = (
                f"breach state {key!r} does not decode ({exc}); delete the worker data dir "
                "and let it restore from the changelog"
            )
            raise CorruptStateError(msg) from exc
        severity: Severity | None = None
        for known in SEVERITIES:
            if wire.severity == known:
                severity = known
        return cls(
            series_key=wire.series_key,
            slo=wire.slo,
            last_at_ms=wire.last_at_ms,
            breach_id=wire.breach_id,
            opened_ms=wire.opened_ms,
            severity=severity,
            last_fired_ms=wire.last_fired_ms,
            last_page_ms=wire.last_page_ms,
            last_emit_ms=wire.last_emit_ms,
            emitted_rates=dict(wire.emitted_rates),
            peak_burn_rates=dict(wire.peak_burn_rates),
            seq=wire.seq,
        )


def _rank(severity: Severity | None) -> int:
    return -1 if severity is None else SEVERITIES.index(severity)


def _material(new: Mapping[str, float], old: Mapping[str, float], policy: BreachPolicy) -> bool:
    for window, rate in new.items():
        before = old.get(window, 0.0)
        if abs(rate - before) >= policy.material_change * max(before, policy.rate_floor):
            return True
    return False


def _peaks(peaks: Mapping[str, float], rates: Mapping[str, float]) -> dict[str, float]:
    out = dict(peaks)
    for window, rate in rates.items():
        if rate > out.get(window, float("-inf")):
            out[window] = rate
    return out


def advance(
    state: BreachState,
    at_ms: int,
    verdict: Verdict,
    policy: BreachPolicy | None = None,
) -> tuple[BreachState, tuple[Transition, ...]]:
    """Fold the verdict of evaluation point ``at_ms`` in; a pure function of its inputs."""
    policy = policy or BreachPolicy()
    if verdict.slo != state.slo:
        msg = f"verdict of SLO {verdict.slo!r} fed to the breach state of SLO {state.slo!r}"
        raise ConfigError(msg)
    if state.last_at_ms is not None and at_ms <= state.last_at_ms:
        return state, ()
    fired = verdict.severity is not None
    rules = tuple(f.rule.name for f in verdict.firing)
    rates = dict(verdict.burn_rates)

    def transition(
        new: BreachState,
        kind: TransitionState,
        reason: UpdateReason | None = None,
        resolved_ms: int | None = None,
    ) -> Transition:
        assert new.breach_id is not None and new.opened_ms is not None
        assert new.severity is not None
        return Transition(
            state=kind,
            breach_id=new.breach_id,
            seq=new.seq,
            at_ms=at_ms,
            series_key=new.series_key,
            slo=new.slo,
            severity=new.severity,
            opened_ms=new.opened_ms,
            resolved_ms=resolved_ms,
            burn_rates=rates,
            peak_burn_rates=dict(new.peak_burn_rates),
            sli=dict(verdict.sli),
            budget_remaining=verdict.budget_remaining,
            rules=rules if kind != "resolved" else (),
            reason=reason,
        )

    if not state.is_open:
        if not fired:
            return replace(state, last_at_ms=at_ms), ()
        new = replace(
            state,
            last_at_ms=at_ms,
            breach_id=breach_id(state.series_key, state.slo, at_ms),
            opened_ms=at_ms,
            severity=verdict.severity,
            last_fired_ms=at_ms,
            last_page_ms=at_ms if verdict.severity == "page" else None,
            last_emit_ms=at_ms,
            emitted_rates=rates,
            peak_burn_rates=dict(rates),
            seq=0,
        )
        return new, (transition(new, "opened"),)

    assert state.last_fired_ms is not None and state.last_emit_ms is not None
    last_fired = at_ms if fired else state.last_fired_ms
    last_page = at_ms if verdict.severity == "page" else state.last_page_ms
    peaks = _peaks(state.peak_burn_rates, rates)
    if not fired and at_ms - last_fired >= policy.resolve_hold_ms:
        closing = replace(state, peak_burn_rates=peaks, seq=state.seq + 1)
        done = BreachState(series_key=state.series_key, slo=state.slo, last_at_ms=at_ms)
        return done, (transition(closing, "resolved", resolved_ms=at_ms),)

    severity = state.severity
    if _rank(verdict.severity) > _rank(severity):
        severity = verdict.severity
    elif severity == "page" and (last_page is None or at_ms - last_page >= policy.resolve_hold_ms):
        severity = "ticket"
    reason: UpdateReason | None = None
    if severity != state.severity:
        reason = "severity"
    elif (
        fired
        and at_ms - state.last_emit_ms >= policy.update_interval_ms
        and _material(rates, state.emitted_rates, policy)
    ):
        reason = "burn_rate"
    new = replace(
        state,
        last_at_ms=at_ms,
        severity=severity,
        last_fired_ms=last_fired,
        last_page_ms=last_page,
        peak_burn_rates=peaks,
    )
    if reason is None:
        return new, ()
    new = replace(new, last_emit_ms=at_ms, emitted_rates=rates, seq=state.seq + 1)
    return new, (transition(new, "updated", reason=reason),)


def replay(
    state: BreachState,
    points: Iterable[tuple[int, Verdict]],
    policy: BreachPolicy | None = None,
) -> tuple[BreachState, list[Transition]]:
    """Fold a sequence of ``(at_ms, verdict)`` in order; returns the state and every transition."""
    out: list[Transition] = []
    for at_ms, verdict in points:
        state, transitions = advance(state, at_ms, verdict, policy)
        out.extend(transitions)
    return state, out
