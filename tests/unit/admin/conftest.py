"""Factories for admin-plane unit tests: a keyring and signed commands."""

import json
from collections.abc import Callable
from typing import Any

import pytest
from tailguard.schemas.signing import signed

from tailguard.admin.keys import Keyring, parse_keyring

NOW = 1_750_000_000_000
SECRETS = {
    "view": "viewer-secret-0123456789",
    "ops": "operator-secret-0123456789",
    "root": "admin-secret-0123456789abc",
    "alice-key": "alice-only-secret-0123456789",
}
KEYS_YAML = f"""
keys:
  view: {{role: viewer, secret: "{SECRETS["view"]}"}}
  ops: {{role: operator, secret: "{SECRETS["ops"]}"}}
  root: {{role: admin, secret: "{SECRETS["root"]}"}}
  alice-key: {{role: admin, secret: "{SECRETS["alice-key"]}", actor: alice}}
"""


@pytest.fixture
def keyring() -> Keyring:
    return parse_keyring(KEYS_YAML, "keys.yaml")


@pytest.fixture
def command() -> Callable[..., dict[str, Any]]:
    """A signed command; ``secret`` defaults to the key's own."""

    def make(
        action: str = "slo.list",
        key_id: str = "view",
        *,
        args: dict[str, Any] | None = None,
        ts_ms: int = NOW,
        command_id: str = "c-1",
        actor: str = "alice",
        secret: str | None = None,
    ) -> dict[str, Any]:
        body = {
            "command_id": command_id,
            "ts_ms": ts_ms,
            "actor": actor,
            "key_id": key_id,
            "action": action,
            "args": args or {},
        }
        return signed(body, (secret or SECRETS.get(key_id, "x" * 20)).encode())

    return make


def raw(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()
