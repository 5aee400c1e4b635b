"""Reply and audit payloads (``tailguard.admin_reply.v1``, ``tailguard.audit.v1``), pure.

Event ids are derived from where the command came from (admin topic,
partition, offset) so that a command re-delivered after a crash yields a
reply and an audit record with the *same* ``event_id``: subscribers
deduplicate on it (at-least-once delivery, deterministic ids — like every
tailguard output).

Nothing secret reaches these records: secrets never leave
:mod:`tailguard.admin.keys`, the signature is not copied, argument values
under secret-looking names (``secret``, ``password``, ``token``,
``credential``, ``private…``) are replaced by ``"[redacted]"``, long strings
are cut (the audit keeps ``args_sha256`` of the full arguments), and a
message that is not a JSON object is described, never copied.
"""

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Final

import rfc8785

from tailguard.admin.gate import Envelope, Refusal

__all__ = [
    "AUDIT_SCHEMA",
    "REPLY_SCHEMA",
    "audit_payload",
    "decision_payload",
    "event_id",
    "redact",
    "reply_payload",
]

REPLY_SCHEMA: Final = "tailguard.admin_reply.v1"
AUDIT_SCHEMA: Final = "tailguard.audit.v1"
_SECRETISH: Final = re.compile(r"secret|passw|token|credential|private|api_?key", re.IGNORECASE)
_MAX_TEXT: Final = 2_000
REDACTED: Final = "[redacted]"


def event_id(*parts: object) -> str:
    """A deterministic 128-bit hex id of ``parts``."""
    text = "|".join(str(p) for p in parts)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def redact(value: Any, depth: int = 0) -> Any:
    """``value`` with secret-looking members replaced and long strings cut."""
    if depth > 12:
        return "[too deep]"
    if isinstance(value, Mapping):
        return {
            str(k): REDACTED if _SECRETISH.search(str(k)) else redact(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v, depth + 1) for v in value[:200]]
    if isinstance(value, str) and len(value) > _MAX_TEXT:
        return value[:_MAX_TEXT] + f"…[{len(value) - _MAX_TEXT} more characters]"
    return value


def args_digest(args: Mapping[str, Any] | None) -> str | None:
    if args is None:
        return None
    try:
        data = rfc8785.dumps(dict(args))
    except rfc8785.CanonicalizationError:
        data = json.dumps(args, sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()


def reply_payload(
    envelope: Envelope,
    origin: Mapping[str, Any],
    *,
    now_ms: int,
    worker: str,
    refusal: Refusal | None = None,
    result: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The one reply of a command: ``ok`` with ``result``, or the refusal's ``error``."""
    return {
        "schema": REPLY_SCHEMA,
        "event_id": event_id("reply", origin["topic"], origin["partition"], origin["offset"]),
        "ts_ms": now_ms,
        "command_id": envelope.command_id,
        "ok": refusal is None,
        "action": envelope.action,
        "actor": envelope.actor,
        "key_id": envelope.key_id,
        "error": None if refusal is None else {"code": refusal.code, "message": refusal.message},
        "result": None if refusal is not None else dict(result or {}),
        "origin": dict(origin),
        "worker": worker,
    }


def audit_payload(
    envelope: Envelope,
    origin: Mapping[str, Any],
    *,
    now_ms: int,
    worker: str,
    authenticated: bool,
    role: str | None,
    refusal: Refusal | None = None,
    failed: bool = False,
    summary: str = "",
) -> dict[str, Any]:
    """The audit record of one command, accepted or refused."""
    outcome = "ok" if refusal is None else ("failed" if failed else "refused")
    return {
        "schema": AUDIT_SCHEMA,
        "event_id": event_id("audit", origin["topic"], origin["partition"], origin["offset"]),
        "ts_ms": now_ms,
        "kind": "command",
        "actor": envelope.actor,
        "authenticated": authenticated,
        "key_id": envelope.key_id,
        "role": role,
        "action": envelope.action,
        "args": redact(envelope.args) if envelope.args is not None else None,
        "args_sha256": args_digest(envelope.args),
        "outcome": outcome,
        "error": None if refusal is None else {"code": refusal.code, "message": refusal.message},
        "command_id": envelope.command_id,
        "command_ts_ms": envelope.ts_ms,
        "origin": dict(origin),
        "worker": worker,
        "summary": summary,
    }


def decision_payload(
    action: str,
    args: Mapping[str, Any],
    outcome: str,
    *,
    seed: str,
    now_ms: int,
    worker: str,
    summary: str = "",
    actor: str = "tailguard",
) -> dict[str, Any]:
    """The audit record of an automatic decision (a breach transition, a rollback …).

    ``seed`` makes the ``event_id`` (use the decision's own event id), so the
    decision re-published after a crash is audited under the same id.
    """
    return {
        "schema": AUDIT_SCHEMA,
        "event_id": event_id("audit", "decision", seed),
        "ts_ms": now_ms,
        "kind": "decision",
        "actor": actor,
        "authenticated": None,
        "key_id": None,
        "role": None,
        "action": action,
        "args": redact(dict(args)),
        "args_sha256": args_digest(args),
        "outcome": outcome,
        "error": None,
        "command_id": None,
        "command_ts_ms": None,
        "origin": None,
        "worker": worker,
        "summary": summary,
    }
