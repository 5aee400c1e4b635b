"""The gate every admin command passes before anything acts on it (pure: no Kafka, no faust).

Checks, in order; the first that fails refuses the command with its code::

    raw message value
      │ not a JSON object (syntax, UTF-8, size, depth, duplicate keys, an array) ─▶ malformed
      │ does not fit tailguard.admin.v1 (missing command_id, wrong types, …) ───▶ invalid
      │ no signature ───────────────────────────────────────────────────────────▶ unsigned
      │ key_id missing or not in the keyring ──────────────────────────────────▶ unknown_key
      │ key retired (rotation/revocation) or past its not_after ────────────────▶ key_expired
      │ HMAC-SHA256 does not match (forged, wrong secret, altered) ────────────▶ bad_signature
      │ ts_ms older than 5 minutes ─────────────────────────────────────────────▶ stale
      │ ts_ms more than 5 minutes ahead ────────────────────────────────────────▶ future
      ▼ authenticated                         (the agent then checks, with its seen table:)
      │ command_id seen before (a different admin message) ─────────────────────▶ replayed
      │ action not registered ─────────────────────────────────────────────────▶ unknown_action
      │ the key's role is below the action's, or the key is bound to another actor ▶ forbidden
      ▼ the handler: bad_args, not_found, not_enabled, conflict, failed — or ok

Authenticity comes before freshness and replay: a forged command is reported
as forged whatever its age, and only an authenticated command's ``command_id``
is remembered (so nobody can burn someone else's command ids with unsigned
messages).

Replay window. A command is fresh while ``now − 5 min ≤ ts_ms ≤ now + 5 min``.
Every authenticated, fresh command's id is remembered with its ``ts_ms``
(:class:`SeenEntry`) until ``ts_ms + 5 min`` has passed; after that a copy is
refused as stale anyway, so the seen set holds at most 10 minutes of commands::

    ts_ms − 5 min        ts_ms              ts_ms + 5 min
    ──────┼──────────────────┼──────────────────┼──────────▶ receiver's wall clock
     future (refused)   fresh: the first copy is accepted,   stale (refused);
                        later copies are "replayed"          the seen entry can go

A copy delivered again *from the same admin-topic offset* (Kafka re-delivery
after a worker crash) is not a replay: it is processed again, and its reply
and audit record carry the same ``event_id`` as the first time.
"""

import json
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from tailguard.admin.keys import Key, Keyring, Role
from tailguard.schemas import AdminCommand, DeadLetterReason, Limits, decode
from tailguard.schemas.signing import SignatureError, verify

__all__ = [
    "CODES",
    "HORIZON_MS",
    "Envelope",
    "Refusal",
    "ReplayWindow",
    "SeenEntry",
    "Verified",
    "authenticate",
    "authorise",
    "replay_check",
]

#: Five minutes: how old (or how far ahead) a command may be.
HORIZON_MS: Final = 5 * 60_000

#: Every error code a reply can carry, and what it means.
CODES: Final[dict[str, str]] = {
    "malformed": "the message is not one JSON object",
    "invalid": "the object does not fit tailguard.admin.v1",
    "unsigned": "the command has no signature",
    "unknown_key": "key_id is missing or not a key of this worker",
    "key_expired": "the key was retired or is past its not_after",
    "bad_signature": "the signature does not match (forged, wrong secret or altered)",
    "stale": "ts_ms is older than 5 minutes",
    "future": "ts_ms is more than 5 minutes ahead",
    "replayed": "this command_id was already received",
    "unknown_action": "no such action",
    "forbidden": "the key's role (or actor binding) does not allow this action",
    "bad_args": "the arguments are wrong",
    "not_found": "the named SLO, breach, silence, key or series does not exist",
    "conflict": "the change would contradict the current state",
    "not_enabled": "the feature is not enabled on this worker",
    "failed": "the worker failed while executing the command",
}

_LIMITS: Final = Limits(
    max_message_bytes=256 * 1024,
    max_batch_events=1,
    max_depth=16,
    # Freshness is judged after the signature, by ReplayWindow, not by the codec.
    max_future_skew_ms=2**53 - 1,
)
_MALFORMED: Final = {
    DeadLetterReason.TOO_LARGE,
    DeadLetterReason.NOT_UTF8,
    DeadLetterReason.TOO_DEEP,
    DeadLetterReason.MALFORMED_JSON,
    DeadLetterReason.NOT_AN_OBJECT,
    DeadLetterReason.BATCH_TOO_LARGE,
    DeadLetterReason.NAN_OR_INFINITE,
}


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a command is refused: a code of :data:`CODES` and a message for people."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Envelope:
    """What is known of an admin message, for its reply and audit record, even if refused.

    Values are taken from the JSON object only when they have the right type;
    a refused command's ``actor`` is what it *claimed*, not who sent it.
    """

    command_id: str | None = None
    ts_ms: int | None = None
    actor: str | None = None
    key_id: str | None = None
    action: str | None = None
    args: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Verified:
    """An authenticated, fresh command and the key that signed it."""

    command: AdminCommand
    document: dict[str, Any]
    key: Key


@dataclass(frozen=True, slots=True)
class ReplayWindow:
    """Freshness rules (see the module docstring)."""

    horizon_ms: int = HORIZON_MS
    future_ms: int = HORIZON_MS

    def freshness(self, ts_ms: int, now_ms: int) -> Refusal | None:
        age = now_ms - ts_ms
        if age > self.horizon_ms:
            return Refusal(
                "stale",
                f"ts_ms {ts_ms} is {age / 1000:.0f} s old; commands older than "
                f"{self.horizon_ms // 1000} s are refused as replays — sign a new one "
                "(and check the sender's clock)",
            )
        if -age > self.future_ms:
            return Refusal(
                "future",
                f"ts_ms {ts_ms} is {-age / 1000:.0f} s ahead of this worker's clock; more "
                f"than {self.future_ms // 1000} s ahead is refused — check the sender's clock",
            )
        return None

    def forgettable(self, ts_ms: int, now_ms: int) -> bool:
        """Whether a seen entry of ``ts_ms`` is no longer needed (a copy would be stale)."""
        return now_ms - ts_ms > self.horizon_ms


class SeenEntry(msgspec.Struct, array_like=True, frozen=True):
    """A remembered command id: its ``ts_ms`` and the admin message that carried it."""

    ts_ms: int
    partition: int
    offset: int

    def to_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def from_bytes(cls, raw: bytes) -> "SeenEntry":
        return msgspec.msgpack.decode(raw, type=cls)


def replay_check(
    seen: SeenEntry | None, command_id: str, partition: int, offset: int
) -> Refusal | None:
    """``None`` when the command is new or a re-delivery of the same message; else a refusal."""
    if seen is None or (seen.partition, seen.offset) == (partition, offset):
        return None
    return Refusal(
        "replayed",
        f"command_id {command_id!r} was already received (admin message at offset "
        f"{seen.offset}); every command needs a new command_id",
    )


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            msg = f"duplicate key {key!r}"
            raise ValueError(msg)
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    msg = f"{name} is not JSON"
    raise ValueError(msg)


def _envelope(doc: dict[str, Any]) -> Envelope:
    def text(name: str) -> str | None:
        value = doc.get(name)
        return value if isinstance(value, str) and value else None

    ts = doc.get("ts_ms")
    args = doc.get("args")
    return Envelope(
        command_id=text("command_id"),
        ts_ms=ts if isinstance(ts, int) and not isinstance(ts, bool) else None,
        actor=text("actor"),
        key_id=text("key_id"),
        action=text("action"),
        args=args if isinstance(args, dict) else None,
    )


def _parse(
    raw: bytes | None, now_ms: int
) -> tuple[Envelope, AdminCommand | Refusal, dict[str, Any]]:
    if raw is None:
        return Envelope(), Refusal("malformed", "the message value is empty (a tombstone)"), {}
    decoded = decode(raw, "admin", now_ms=now_ms, limits=_LIMITS)
    whole = decoded.rejects[0] if decoded.rejects else None
    if whole is not None and whole.reason in _MALFORMED and whole.index is None:
        return Envelope(), Refusal("malformed", f"not a JSON command object: {whole.detail}"), {}
    if raw.lstrip(b" \t\r\n")[:1] != b"{":
        return Envelope(), Refusal("malformed", "a message holds exactly one command object"), {}
    try:
        doc = json.loads(raw, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:
        return Envelope(), Refusal("malformed", f"not a JSON command object: {exc}"), {}
    envelope = _envelope(doc)
    if whole is not None:
        return envelope, Refusal("invalid", f"not a {_SCHEMA} command: {whole.detail}"), doc
    return envelope, decoded.valid[0], doc


_SCHEMA: Final = "tailguard.admin.v1"


def authenticate(
    raw: bytes | None, keyring: Keyring, now_ms: int, window: ReplayWindow | None = None
) -> tuple[Envelope, Verified | Refusal]:
    """Parse, validate, verify the signature and the freshness of one admin message."""
    window = window or ReplayWindow()
    envelope, parsed, doc = _parse(raw, now_ms)
    if isinstance(parsed, Refusal):
        return envelope, parsed
    command = parsed
    if not command.signature:
        return envelope, Refusal(
            "unsigned",
            "the command has no signature; sign it with HMAC-SHA256 over its canonical JSON "
            "(see tailguard.schemas.signing, or use `tailguard admin`)",
        )
    if not command.key_id:
        return envelope, Refusal("unknown_key", "the command names no key_id")
    key = keyring.get(command.key_id)
    if key is None:
        where = (
            "this worker has no admin keys file (start it with --admin-keys or "
            "TAILGUARD_ADMIN_KEYS)"
            if not len(keyring)
            else "no such key in the worker's keys file"
        )
        return envelope, Refusal("unknown_key", f"key_id {command.key_id!r}: {where}")
    unusable = key.usable_at(now_ms)
    if unusable is not None:
        return envelope, Refusal("key_expired", f"{unusable}; sign with its replacement")
    try:
        valid = verify(doc, key.secret)
    except SignatureError as exc:
        return envelope, Refusal("bad_signature", str(exc))
    if not valid:
        return envelope, Refusal(
            "bad_signature",
            f"the signature does not match key {key.key_id!r}: the command was altered, or "
            "signed with another secret",
        )
    stale = window.freshness(command.ts_ms, now_ms)
    if stale is not None:
        return envelope, stale
    return envelope, Verified(command, doc, key)


def authorise(verified: Verified, action: str, needs: Role) -> Refusal | None:
    """Whether the signing key may run ``action`` (which needs role ``needs``)."""
    key = verified.key
    if key.actor is not None and key.actor != verified.command.actor:
        return Refusal(
            "forbidden",
            f"key {key.key_id!r} is bound to actor {key.actor!r}, but the command names "
            f"actor {verified.command.actor!r}",
        )
    if key.role < needs:
        return Refusal(
            "forbidden",
            f"{action} needs the {needs.name} role; key {key.key_id!r} has role {key.role.name}",
        )
    return None
