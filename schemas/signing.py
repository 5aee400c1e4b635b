"""Signing of admin commands (docs/admin.md): canonical JSON and HMAC-SHA256.

A ``tailguard.admin.v1`` command carries ``signature``: the lower-case hex
HMAC-SHA256, keyed by the UTF-8 bytes of the secret of ``key_id``, of the
*canonical JSON* of the command object without its ``signature`` member.

Canonical JSON is RFC 8785, the JSON Canonicalization Scheme (JCS), through
the ``rfc8785`` package (Trail of Bits): object members sorted by key, no
whitespace, UTF-8 without escapes for non-ASCII characters, numbers written as
ECMAScript writes them (``1.0`` → ``1``, ``1e-7`` → ``1e-7``). Sorted keys and
no whitespace are what the command format asks; JCS pins down the rest — number format
and string escaping — so that a signer in any language with a JCS library
(Go, Java, JavaScript, Rust all have one) produces the same bytes. Integers
outside ±(2**53 − 1) and non-finite numbers have no canonical form and make a
command unsignable (:class:`SignatureError`).

What is signed is the parsed command, not its bytes: a producer may pretty-print
or reorder what it sends. The verifier parses the message value, drops
``signature`` and canonicalises the rest, so every member the producer sent —
including ones tailguard does not know — is covered by the signature.

Example (secret ``"s3cret-s3cret-s3cret"``)::

    {"action":"slo.list","actor":"alice","args":{},"command_id":"c-1","key_id":"ops","ts_ms":1}
    → signature = hex(HMAC-SHA256(b"s3cret-s3cret-s3cret", <those bytes>))
"""

import hashlib
import hmac
import re
from collections.abc import Mapping
from typing import Any, Final

import rfc8785
from tailguard.schemas.errors import SchemaError

__all__ = [
    "SIGNATURE_FIELD",
    "SignatureError",
    "canonical_json",
    "sign",
    "signature_of",
    "signed",
    "verify",
]

#: The member that holds the signature and is left out of what is signed.
SIGNATURE_FIELD: Final = "signature"
_HEX64: Final = re.compile(r"[0-9a-f]{64}")


class SignatureError(SchemaError):
    """A command cannot be canonicalised (so neither signed nor verified)."""


def canonical_json(command: Mapping[str, Any]) -> bytes:
    """RFC 8785 bytes of ``command`` without its ``signature`` member."""
    body = {k: v for k, v in command.items() if k != SIGNATURE_FIELD}
    try:
        return rfc8785.dumps(body)
    except rfc8785.CanonicalizationError as exc:
        msg = (
            f"the command has no canonical JSON form ({exc}); use integers within "
            "±(2**53 - 1), finite numbers and string keys"
        )
        raise SignatureError(msg) from None


def signature_of(command: Mapping[str, Any], secret: bytes) -> str:
    """Lower-case hex HMAC-SHA256 of the canonical JSON of ``command``, keyed by ``secret``."""
    return hmac.new(secret, canonical_json(command), hashlib.sha256).hexdigest()


def sign(command: Mapping[str, Any], secret: bytes) -> str:
    """Alias of :func:`signature_of` (the signer's name for it)."""
    return signature_of(command, secret)


def signed(command: Mapping[str, Any], secret: bytes) -> dict[str, Any]:
    """A copy of ``command`` with its ``signature`` set."""
    out = {k: v for k, v in command.items() if k != SIGNATURE_FIELD}
    out[SIGNATURE_FIELD] = signature_of(out, secret)
    return out


def verify(command: Mapping[str, Any], secret: bytes) -> bool:
    """Whether ``command["signature"]`` is the signature of the rest under ``secret``.

    Constant-time comparison; a missing, non-string or non-hex signature is
    simply not valid. Raises :class:`SignatureError` only when the command has
    no canonical form.
    """
    given = command.get(SIGNATURE_FIELD)
    if not isinstance(given, str) or _HEX64.fullmatch(given.lower()) is None:
        return False
    return hmac.compare_digest(signature_of(command, secret), given.lower())
