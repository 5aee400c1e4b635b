"""Admin keys files: roles, secrets (never shown), expiry, errors that name the problem."""

from pathlib import Path

import pytest

from tailguard.admin.errors import KeyFileError
from tailguard.admin.keys import Keyring, Role, load_key, load_keyring, parse_keyring

from .conftest import SECRETS


def test_keys_are_read_with_their_roles(keyring: Keyring) -> None:
    assert {k.key_id: k.role for k in keyring.all()} == {
        "alice-key": Role.admin,
        "ops": Role.operator,
        "root": Role.admin,
        "view": Role.viewer,
    }
    assert keyring.get("ops") is not None
    assert keyring.get("ops").secret == SECRETS["ops"].encode()  # type: ignore[union-attr]


def test_secrets_never_show(keyring: Keyring) -> None:
    shown = repr(keyring.all()) + repr(keyring.describe(0))
    assert not any(secret in shown for secret in SECRETS.values())
    assert set(keyring.describe(0)[0]) == {
        "key_id",
        "role",
        "actor",
        "not_after",
        "retired_at",
        "usable",
    }


def test_a_secret_can_come_from_the_environment() -> None:
    ring = parse_keyring(
        "k: {role: operator, secret_env: TG_K}", env={"TG_K": "from-the-environment!"}
    )
    assert ring.get("k").secret == b"from-the-environment!"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("k: {role: root, secret: 0123456789abcdefgh}", "viewer, operator, admin"),
        ("k: {secret: 0123456789abcdefgh}", "no role"),
        ("k: {role: admin}", "exactly one of secret or secret_env"),
        ("k: {role: admin, secret: short}", "at least 16"),
        ("k: {role: admin, secret_env: NOT_SET_ANYWHERE}", "NOT_SET_ANYWHERE"),
        ("k: {role: admin, secret: 0123456789abcdefgh, colour: red}", "unknown field"),
        ("k: {role: admin, secret: 0123456789abcdefgh, not_after: someday}", "ISO 8601"),
        ("[1, 2]", "mapping of key ids"),
        ("k: [", "not valid YAML"),
    ],
)
def test_bad_keys_files_say_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(KeyFileError, match=problem):
        parse_keyring(text, "keys.yaml", env={})


def test_json_keys_files_work_too() -> None:
    ring = parse_keyring('{"keys": {"j": {"role": "viewer", "secret": "0123456789abcdefgh"}}}')
    assert ring.get("j").role is Role.viewer  # type: ignore[union-attr]


def test_not_after_is_honoured() -> None:
    ring = parse_keyring("k: {role: admin, secret: 0123456789abcdefgh, not_after: 1000}")
    key = ring.get("k")
    assert key is not None
    assert key.usable_at(1000) is None and "expired" in str(key.usable_at(1001))


def test_retirements_survive_a_reload(keyring: Keyring) -> None:
    keyring.retire("ops", 5)
    reloaded = keyring.with_keys_of(
        parse_keyring('ops: {role: operator, secret: "new-secret-0123456789"}')
    )
    key = reloaded.get("ops")
    assert key is not None and key.retired_ms == 5 and key.secret == b"new-secret-0123456789"


def test_the_cli_reads_only_its_own_key(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(
        "keys:\n  mine: {role: admin, secret: 0123456789abcdefgh}\n"
        "  theirs: {role: admin, secret_env: UNSET_ELSEWHERE}\n"
    )
    assert load_key(path, "mine", env={}).secret == b"0123456789abcdefgh"
    with pytest.raises(KeyFileError, match="name one with --key-id"):
        load_key(path, None, env={})
    with pytest.raises(KeyFileError, match="UNSET_ELSEWHERE"):
        load_keyring(path, env={})


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot read"):
        load_keyring(tmp_path / "nope.yaml")
