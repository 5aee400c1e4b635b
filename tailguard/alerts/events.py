"""Breach and release records as the subscribers see them, and the filters they apply.

A record of ``tailguard.breaches`` (``tailguard.breach.v1``) or
``tailguard.releases`` (``tailguard.release.v1``) is decoded into an
:class:`AlertEvent`: the raw JSON object plus the few fields every subscriber
needs (event id, severity, service, breach kind, decision). Only what the
subscribers rely on is checked; unknown fields are kept and ignored
(forward compatibility).

Release decisions have no severity of their own; an operator pages on a
rollback, files a ticket on a hold and only wants to know about the rest::

    rollback → page     hold → ticket     promote, continue → info

Silences: an admin silence (``tailguard admin silence add``) does not drop
breach records, it marks them ``silenced: true`` (with ``silence_id``) so the
trail stays complete. Subscribers that page must not page on them:
:class:`EventFilter` with ``include_silenced=False`` (the forwarder's default)
drops a silenced ``opened`` or ``updated`` transition, but lets a silenced
``resolved`` one through, so that an alert that fired before the silence began
is still closed at the receiver (resolving an alert it never saw is a no-op
for Alertmanager).
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Final, Literal

from tailguard.alerts.errors import BadEvent

__all__ = [
    "BREACH_STATES",
    "DECISIONS",
    "RELEASE_SEVERITY",
    "SEVERITIES",
    "AlertEvent",
    "EventFilter",
    "EventKind",
    "decode_event",
]

EventKind = Literal["breach", "release"]

BREACH_STATES: Final = ("opened", "updated", "resolved")
DECISIONS: Final = ("rollback", "promote", "hold", "continue")
#: Severities a subscriber can filter on: the breaches' two and ``info`` for releases.
SEVERITIES: Final = ("page", "ticket", "info")
RELEASE_SEVERITY: Final[dict[str, str]] = {
    "rollback": "page",
    "hold": "ticket",
    "promote": "info",
    "continue": "info",
}


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """One breach transition or release decision."""

    kind: EventKind
    body: dict[str, Any]
    event_id: str
    severity: str
    #: ``series.service`` of a breach; a release's ``service`` field when it has one.
    service: str | None
    #: The breach kind (``burn_rate``, ``silent_degradation``, …); None for a release.
    breach_kind: str | None
    #: The release decision; None for a breach.
    decision: str | None

    @property
    def resolved(self) -> bool:
        """A breach's ``resolved`` transition."""
        return self.kind == "breach" and self.body.get("state") == "resolved"

    @property
    def silenced(self) -> bool:
        """A breach transition an admin silence matched (``silenced: true``)."""
        return self.kind == "breach" and self.body.get("silenced") is True


def _text(body: dict[str, Any], name: str, kind: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        msg = f"{kind} event without a {name} (a non-empty string), got {value!r}"
        raise BadEvent(msg)
    return value


def decode_event(value: bytes | None, kind: EventKind) -> AlertEvent:
    """The :class:`AlertEvent` of one record value of the breaches or releases topic.

    Raises :class:`BadEvent` with the reason when it is not one.
    """
    try:
        body = json.loads(value or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        msg = f"not JSON ({exc})"
        raise BadEvent(msg) from None
    if not isinstance(body, dict):
        msg = f"not a JSON object but {type(body).__name__}"
        raise BadEvent(msg)
    event_id = _text(body, "event_id", kind)
    if kind == "breach":
        _text(body, "breach_id", kind)
        state = _text(body, "state", kind)
        if state not in BREACH_STATES:
            msg = f"breach event {event_id} has state {state!r}, not one of {BREACH_STATES}"
            raise BadEvent(msg)
        severity = _text(body, "severity", kind)
        series = body.get("series")
        if not isinstance(series, dict) or not isinstance(series.get("service"), str):
            msg = f"breach event {event_id} has no series.service"
            raise BadEvent(msg)
        breach_kind = body.get("kind")
        return AlertEvent(
            kind="breach",
            body=body,
            event_id=event_id,
            severity=severity,
            service=series["service"],
            breach_kind=breach_kind if isinstance(breach_kind, str) else None,
            decision=None,
        )
    _text(body, "experiment", kind)
    decision = _text(body, "decision", kind)
    service = body.get("service")
    return AlertEvent(
        kind="release",
        body=body,
        event_id=event_id,
        severity=RELEASE_SEVERITY.get(decision, "info"),
        service=service if isinstance(service, str) else None,
        breach_kind=None,
        decision=decision,
    )


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which events a subscriber wants; an empty criterion lets everything through.

    ``services`` are exact names or globs (``chat-*``). A criterion that an
    event has no field for excludes it: with ``kinds`` set no release passes
    (releases have no breach kind), with ``decisions`` set no breach passes,
    and with ``services`` set a release passes only when it names a service.
    ``send_resolved=False`` drops breaches' ``resolved`` transitions (as
    Alertmanager's ``send_resolved: false``). ``include_silenced=False`` drops
    silenced breach transitions except ``resolved`` ones (see the module doc).
    """

    severities: frozenset[str] = frozenset()
    services: tuple[str, ...] = ()
    kinds: frozenset[str] = frozenset()
    decisions: frozenset[str] = frozenset()
    send_resolved: bool = True
    include_silenced: bool = True

    @classmethod
    def of(
        cls,
        *,
        severities: Iterable[str] = (),
        services: Iterable[str] = (),
        kinds: Iterable[str] = (),
        decisions: Iterable[str] = (),
        send_resolved: bool = True,
        include_silenced: bool = True,
    ) -> "EventFilter":
        return cls(
            frozenset(severities),
            tuple(services),
            frozenset(kinds),
            frozenset(decisions),
            send_resolved,
            include_silenced,
        )

    def mutes(self, event: AlertEvent) -> bool:
        """Whether ``event`` is left out because a silence matched it."""
        return not self.include_silenced and event.silenced and not event.resolved

    def matches(self, event: AlertEvent) -> bool:
        if self.severities and event.severity not in self.severities:
            return False
        if self.services and (
            event.service is None
            or not any(fnmatchcase(event.service, pattern) for pattern in self.services)
        ):
            return False
        if self.kinds and event.breach_kind not in self.kinds:
            return False
        if self.decisions and event.decision not in self.decisions:
            return False
        if self.mutes(event):
            return False
        return self.send_resolved or not event.resolved
