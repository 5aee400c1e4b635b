"""Silences: operator-set mutes of breach alerts, by series labels, SLO and kind, until expiry.

A silence does not stop detection. Breach lifecycles go on exactly as without
it (so an alert that opens while silenced still resolves, and an open breach
is not re-opened when the silence ends); every ``tailguard.breach.v1`` record
a silence matches is published *marked*: ``silenced: true`` and
``silence_id``. Subscribers that notify people (pagers, chat) skip marked
records; dashboards and the audit trail still see everything. Unmatched
records carry ``silenced: false`` and ``silence_id: null``.

Expiry is **wall-clock** time, judged by the worker when it publishes a
record: a silence is operator intent in real time ("mute this for 2 h while I
fix it"), not a statement about event time. (So replaying old input while a
silence is active marks it too; breach ids and sequences do not change.)

Matchers are shell-style globs (``*``, ``?``, ``[ab]``) on the breach's
``service``, ``model``, ``variant``, ``tenant``, ``slo`` and ``kind``; a
label left out matches anything. A silence must name at least one matcher
other than ``*`` unless ``all: true`` is given, and lasts at most 30 days.
"""

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from tailguard.admin.errors import CommandError

__all__ = ["MATCHERS", "MAX_SILENCE_MS", "Silence", "parse_duration_ms", "silence_from_args"]

#: Breach fields a silence can match (series labels, then slo and kind).
MATCHERS = ("service", "model", "variant", "tenant", "slo", "kind")
MAX_SILENCE_MS = 30 * 86_400_000
_UNITS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: object) -> int:
    """``"90s"``, ``"15m"``, ``"2h"``, ``"1d"`` (or a number of seconds) → milliseconds."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        ms = int(text * 1000)
    elif isinstance(text, str) and len(text) > 1 and text[-1] in _UNITS and text[:-1].isdigit():
        ms = int(text[:-1]) * _UNITS[text[-1]]
    else:
        raise CommandError(
            "bad_args", f"duration must be like 90s, 15m, 2h or 1d (or seconds), got {text!r}"
        )
    if ms <= 0:
        raise CommandError("bad_args", f"duration must be positive, got {text!r}")
    return ms


@dataclass(frozen=True, slots=True)
class Silence:
    """One silence, as stored on the control topic (``silence/<silence_id>``)."""

    silence_id: str
    matchers: Mapping[str, str]
    starts_ms: int
    ends_ms: int
    created_by: str
    reason: str
    command_id: str

    def active_at(self, now_ms: int) -> bool:
        return self.starts_ms <= now_ms < self.ends_ms

    def matches(self, breach: Mapping[str, Any]) -> bool:
        """Whether a ``tailguard.breach.v1`` payload falls under this silence."""
        series = breach.get("series") or {}
        for name, pattern in self.matchers.items():
            value = series.get(name) if name in MATCHERS[:4] else breach.get(name)
            if not isinstance(value, str) or not fnmatchcase(value, pattern):
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        return {
            "silence_id": self.silence_id,
            "matchers": dict(self.matchers),
            "starts_ms": self.starts_ms,
            "ends_ms": self.ends_ms,
            "created_by": self.created_by,
            "reason": self.reason,
            "command_id": self.command_id,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Silence":
        return cls(
            silence_id=str(d["silence_id"]),
            matchers={str(k): str(v) for k, v in dict(d["matchers"]).items()},
            starts_ms=int(d["starts_ms"]),
            ends_ms=int(d["ends_ms"]),
            created_by=str(d["created_by"]),
            reason=str(d["reason"]),
            command_id=str(d["command_id"]),
        )


def silence_id_for(command_id: str) -> str:
    """Deterministic id: a re-delivered ``silence.add`` makes the same silence."""
    return "sil-" + hashlib.blake2b(command_id.encode(), digest_size=6).hexdigest()


def silence_from_args(
    args: Mapping[str, Any], *, actor: str, command_id: str, now_ms: int
) -> Silence:
    """A silence from ``silence.add`` arguments; ``CommandError("bad_args")`` when wrong.

    Arguments: matchers (``service``, ``model``, ``variant``, ``tenant``,
    ``slo``, ``kind``; globs), ``duration`` (``2h``…) or ``until_ms`` (epoch
    ms), ``reason`` (required), ``all`` (true to allow a silence matching
    every breach).
    """
    allowed = {*MATCHERS, "duration", "until_ms", "reason", "all"}
    unknown = sorted(set(args) - allowed)
    if unknown:
        raise CommandError(
            "bad_args", f"silence.add does not take {unknown}; its arguments: {sorted(allowed)}"
        )
    matchers: dict[str, str] = {}
    for name in MATCHERS:
        if name in args:
            value = args[name]
            if not isinstance(value, str) or not value:
                raise CommandError("bad_args", f"args.{name} must be a non-empty glob string")
            if value != "*":
                matchers[name] = value
    if not matchers and args.get("all") is not True:
        raise CommandError(
            "bad_args",
            "a silence needs at least one matcher (service, model, variant, tenant, slo, kind); "
            "pass all: true to silence every breach",
        )
    reason = args.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise CommandError("bad_args", "silence.add needs args.reason (why it is silenced)")
    if ("duration" in args) == ("until_ms" in args):
        raise CommandError("bad_args", "silence.add needs exactly one of duration or until_ms")
    if "duration" in args:
        ends = now_ms + parse_duration_ms(args["duration"])
    else:
        until = args["until_ms"]
        if not isinstance(until, int) or isinstance(until, bool):
            raise CommandError("bad_args", f"args.until_ms must be epoch ms, got {until!r}")
        if until <= now_ms:
            raise CommandError("bad_args", f"until_ms {until} is not in the future")
        ends = until
    if ends - now_ms > MAX_SILENCE_MS:
        raise CommandError("bad_args", "a silence lasts at most 30 days; renew it when it ends")
    return Silence(
        silence_id=silence_id_for(command_id),
        matchers=matchers,
        starts_ms=now_ms,
        ends_ms=ends,
        created_by=actor,
        reason=reason.strip(),
        command_id=command_id,
    )
