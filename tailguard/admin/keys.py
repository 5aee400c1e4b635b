"""Admin keys: who may sign commands, with which role.

A keys file is YAML (or JSON, which YAML reads too)::

    keys:
      ops-2025-06:                 # key_id, as commands name it
        role: operator             # viewer | operator | admin
        secret_env: TG_KEY_OPS     # the secret is read from this environment variable …
        actor: alice               # optional: commands signed with it must name this actor
        not_after: 2025-12-31T23:59:59Z   # optional: refused after this instant (UTC)
      ci-viewer:
        role: viewer
        secret: "a-long-random-string-of-at-least-16-bytes"   # … or written here

The top-level ``keys:`` may be left out (the file is then the mapping itself).
A secret is used as its UTF-8 bytes and must be at least 16 bytes long.

Roles are ordered, each including the ones below it::

    viewer    queries (slo get/list, breach list, silence list, series snapshot …)
    operator  + breach ack, silences, experiment create/stop, manual rollback
    admin     + SLO changes and key rotation

Secrets never leave this module: :class:`Key` does not show its secret in
``repr``, and :meth:`Keyring.describe` (what replies and the audit trail see)
lists ids, roles, actors and dates only.

Runtime state on top of the file: a key can be *retired* from an instant on
(key rotation with a grace period, or revocation). Retirements come from the
control topic, so they reach every worker and survive restarts; key ids are
therefore never reused.
"""

import datetime as dt
import enum
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from tailguard.admin.errors import KeyFileError

__all__ = [
    "MIN_SECRET_BYTES",
    "Key",
    "Keyring",
    "Role",
    "load_key",
    "load_keyring",
    "parse_keyring",
]

#: Shortest secret accepted (HMAC-SHA256 keys this short are already guessable offline).
MIN_SECRET_BYTES = 16


class Role(enum.IntEnum):
    """A key's role; a higher role may do everything a lower one may."""

    viewer = 1
    operator = 2
    admin = 3

    @classmethod
    def parse(cls, value: object, where: str = "role") -> "Role":
        if isinstance(value, Role):
            return value
        if isinstance(value, str) and value in cls.__members__:
            return cls[value]
        msg = f"{where} must be one of viewer, operator, admin; got {value!r}"
        raise KeyFileError(msg)


@dataclass(frozen=True, slots=True)
class Key:
    """One signing key. ``secret`` is never shown (``repr=False``)."""

    key_id: str
    role: Role
    secret: bytes = field(repr=False)
    actor: str | None = None
    not_after_ms: int | None = None
    #: Set at run time (rotation, revocation): refused from this instant on.
    retired_ms: int | None = None

    def usable_at(self, now_ms: int) -> str | None:
        """Why the key cannot sign at ``now_ms`` (``None`` when it can)."""
        if self.retired_ms is not None and now_ms >= self.retired_ms:
            return f"key {self.key_id!r} was retired at {_iso(self.retired_ms)}"
        if self.not_after_ms is not None and now_ms > self.not_after_ms:
            return f"key {self.key_id!r} expired at {_iso(self.not_after_ms)} (not_after)"
        return None

    def describe(self, now_ms: int | None = None) -> dict[str, Any]:
        """What may be shown about the key: never its secret."""
        out: dict[str, Any] = {
            "key_id": self.key_id,
            "role": self.role.name,
            "actor": self.actor,
            "not_after": _iso(self.not_after_ms) if self.not_after_ms is not None else None,
            "retired_at": _iso(self.retired_ms) if self.retired_ms is not None else None,
        }
        if now_ms is not None:
            out["usable"] = self.usable_at(now_ms) is None
        return out


def _iso(ms: int) -> str:
    return (
        dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z")
    )


class Keyring:
    """The keys of a worker (or of the CLI): file keys plus run-time retirements."""

    def __init__(self, keys: Iterable[Key] = (), source: str = "<none>") -> None:
        self._keys: dict[str, Key] = {k.key_id: k for k in keys}
        self._retired: dict[str, int] = {}
        self.source = source

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def get(self, key_id: str) -> Key | None:
        key = self._keys.get(key_id)
        if key is None:
            return None
        retired = self._retired.get(key_id)
        return key if retired is None else replace(key, retired_ms=retired)

    def all(self) -> list[Key]:
        return [k for k in (self.get(i) for i in sorted(self._keys)) if k is not None]

    def retire(self, key_id: str, at_ms: int | None) -> None:
        """Refuse ``key_id`` from ``at_ms`` on (``None``: lift the retirement)."""
        if at_ms is None:
            self._retired.pop(key_id, None)
        else:
            self._retired[key_id] = at_ms

    def retirements(self) -> dict[str, int]:
        return dict(self._retired)

    def with_keys_of(self, other: "Keyring") -> "Keyring":
        """``other``'s keys (a reloaded file) with this keyring's retirements kept."""
        merged = Keyring(other._keys.values(), other.source)
        merged._retired = dict(self._retired)
        return merged

    def describe(self, now_ms: int | None = None) -> list[dict[str, Any]]:
        return [k.describe(now_ms) for k in self.all()]


def _timestamp_ms(value: object, where: str) -> int:
    if isinstance(value, bool):
        msg = f"{where} must be a date-time (ISO 8601) or epoch milliseconds, got {value!r}"
        raise KeyFileError(msg)
    if isinstance(value, int):
        return value
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return int(moment.timestamp() * 1000)
    if isinstance(value, dt.date):
        return int(
            dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC).timestamp() * 1000
        )
    if isinstance(value, str):
        try:
            moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return _timestamp_ms(moment, where)
    msg = f"{where} must be a date-time (ISO 8601, e.g. 2025-12-31T23:59:59Z), got {value!r}"
    raise KeyFileError(msg)


_FIELDS = {"role", "secret", "secret_env", "actor", "not_after"}


def _key(key_id: object, spec: object, where: str, env: Mapping[str, str]) -> Key:
    if not isinstance(key_id, str) or not key_id:
        msg = f"{where}: key ids must be non-empty strings, got {key_id!r}"
        raise KeyFileError(msg)
    at = f"{where}: key {key_id!r}"
    if not isinstance(spec, Mapping):
        msg = f"{at} must be a mapping with role and secret or secret_env"
        raise KeyFileError(msg)
    unknown = sorted(set(map(str, spec)) - _FIELDS)
    if unknown:
        msg = f"{at}: unknown field(s) {unknown}; allowed: {sorted(_FIELDS)}"
        raise KeyFileError(msg)
    if "role" not in spec:
        msg = f"{at} has no role (viewer, operator or admin)"
        raise KeyFileError(msg)
    role = Role.parse(spec["role"], f"{at}: role")
    if ("secret" in spec) == ("secret_env" in spec):
        msg = f"{at} needs exactly one of secret or secret_env"
        raise KeyFileError(msg)
    if "secret_env" in spec:
        name = spec["secret_env"]
        if not isinstance(name, str) or not name:
            msg = f"{at}: secret_env must name an environment variable"
            raise KeyFileError(msg)
        if name not in env:
            msg = f"{at}: environment variable {name} (secret_env) is not set"
            raise KeyFileError(msg)
        text = env[name]
    else:
        text = spec["secret"]
        if not isinstance(text, str):
            msg = f"{at}: secret must be a string"
            raise KeyFileError(msg)
    secret = text.encode("utf-8")
    if len(secret) < MIN_SECRET_BYTES:
        msg = f"{at}: the secret is {len(secret)} bytes; use at least {MIN_SECRET_BYTES}"
        raise KeyFileError(msg)
    actor = spec.get("actor")
    if actor is not None and (not isinstance(actor, str) or not actor):
        msg = f"{at}: actor must be a non-empty string"
        raise KeyFileError(msg)
    not_after = spec.get("not_after")
    return Key(
        key_id=key_id,
        role=role,
        secret=secret,
        actor=actor,
        not_after_ms=None if not_after is None else _timestamp_ms(not_after, f"{at}: not_after"),
    )


def _mapping(text: str, source: str) -> Mapping[Any, Any]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        msg = f"{source}{line}: not valid YAML/JSON ({getattr(exc, 'problem', None) or exc})"
        raise KeyFileError(msg) from None
    if isinstance(doc, Mapping) and set(doc) == {"keys"}:
        doc = doc["keys"]
    if not isinstance(doc, Mapping) or not doc:
        msg = f"{source}: expected a mapping of key ids (under keys:) to key definitions"
        raise KeyFileError(msg)
    return doc


def parse_keyring(
    text: str, source: str = "<string>", env: Mapping[str, str] | None = None
) -> Keyring:
    """A keyring from the text of a keys file (YAML or JSON)."""
    env = os.environ if env is None else env
    doc = _mapping(text, source)
    return Keyring((_key(k, v, source, env) for k, v in doc.items()), source)


def _read(path: str | os.PathLike[str]) -> tuple[str, str]:
    file = Path(path)
    try:
        return file.read_text(encoding="utf-8"), str(file)
    except OSError as exc:
        msg = f"{file}: cannot read the admin keys file ({exc.strerror or exc})"
        raise KeyFileError(msg) from None
    except UnicodeDecodeError as exc:
        msg = f"{file}: not UTF-8 ({exc.reason})"
        raise KeyFileError(msg) from None


def load_key(
    path: str | os.PathLike[str], key_id: str | None = None, env: Mapping[str, str] | None = None
) -> Key:
    """One key of a keys file (the CLI's view: only that key's secret must be available).

    ``key_id`` may be left out when the file holds exactly one key.
    """
    text, source = _read(path)
    doc = _mapping(text, source)
    if key_id is None:
        if len(doc) != 1:
            msg = f"{source} holds {len(doc)} keys; name one with --key-id: {sorted(map(str, doc))}"
            raise KeyFileError(msg)
        key_id = str(next(iter(doc)))
    if key_id not in doc:
        msg = f"{source}: no key {key_id!r}; it holds {sorted(map(str, doc))}"
        raise KeyFileError(msg)
    return _key(key_id, doc[key_id], source, os.environ if env is None else env)


def load_keyring(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Keyring:
    """The keyring of a keys file; errors name the file and what is wrong."""
    text, source = _read(path)
    return parse_keyring(text, source, env)
