"""The admin gate: every refusal kind, in order, and the replay window."""

import json
from collections.abc import Callable
from typing import Any

import pytest

from tailguard.admin.gate import (
    CODES,
    ReplayWindow,
    SeenEntry,
    Verified,
    authenticate,
    authorise,
    replay_check,
)
from tailguard.admin.keys import Keyring, Role

from .conftest import NOW, raw

MIN = 60_000


def code_of(keyring: Keyring, message: bytes | None, now: int = NOW) -> str | None:
    _, verdict = authenticate(message, keyring, now)
    return None if isinstance(verdict, Verified) else verdict.code


def test_a_signed_fresh_command_is_verified(keyring: Keyring, command: Callable[..., Any]) -> None:
    envelope, verdict = authenticate(raw(command()), keyring, NOW)
    assert isinstance(verdict, Verified)
    assert verdict.key.key_id == "view" and verdict.key.role is Role.viewer
    assert (envelope.command_id, envelope.action, envelope.actor) == ("c-1", "slo.list", "alice")


@pytest.mark.parametrize(
    "message",
    [
        b'{"command_id": ',
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b"42",
        None,
        b'{"command_id":"a","command_id":"b","ts_ms":1,"actor":"x","action":"y"}',
        b'{"a": NaN}',
    ],
)
def test_what_is_not_one_json_object_is_malformed(keyring: Keyring, message: bytes | None) -> None:
    assert code_of(keyring, message) == "malformed"


def test_an_array_holding_one_command_is_malformed(
    keyring: Keyring, command: Callable[..., Any]
) -> None:
    assert code_of(keyring, b"[" + raw(command()) + b"]") == "malformed"


@pytest.mark.parametrize(
    "change",
    [
        {"command_id": None},
        {"ts_ms": "yesterday"},
        {"args": [1, 2]},
        {"schema": "tailguard.admin.v9"},
    ],
)
def test_fields_of_the_wrong_type_are_invalid(
    keyring: Keyring, command: Callable[..., Any], change: dict[str, Any]
) -> None:
    doc = {**command(), **change}
    doc = {k: v for k, v in doc.items() if v is not None}
    assert code_of(keyring, raw(doc)) == "invalid"


def test_invalid_commands_keep_what_can_be_read_for_the_reply(keyring: Keyring) -> None:
    envelope, verdict = authenticate(
        b'{"command_id":"c-9","actor":"bob","action":"slo.list"}', keyring, NOW
    )
    assert not isinstance(verdict, Verified) and verdict.code == "invalid"
    assert (envelope.command_id, envelope.actor, envelope.action) == ("c-9", "bob", "slo.list")


def test_no_signature_is_unsigned(keyring: Keyring, command: Callable[..., Any]) -> None:
    doc = command()
    del doc["signature"]
    assert code_of(keyring, raw(doc)) == "unsigned"


def test_an_unknown_key_id_is_refused(keyring: Keyring, command: Callable[..., Any]) -> None:
    assert code_of(keyring, raw(command(key_id="nobody"))) == "unknown_key"


def test_a_worker_without_keys_says_so(command: Callable[..., Any]) -> None:
    _, verdict = authenticate(raw(command()), Keyring(), NOW)
    assert not isinstance(verdict, Verified)
    assert verdict.code == "unknown_key" and "no admin keys file" in verdict.message


def test_the_wrong_secret_is_a_bad_signature(keyring: Keyring, command: Callable[..., Any]) -> None:
    doc = command(key_id="root", secret="not-the-admin-secret-at-all")
    assert code_of(keyring, raw(doc)) == "bad_signature"


def test_an_altered_command_is_a_bad_signature(
    keyring: Keyring, command: Callable[..., Any]
) -> None:
    doc = command(key_id="view")
    doc["action"] = "key.revoke"
    assert code_of(keyring, raw(doc)) == "bad_signature"


def test_forged_commands_are_refused_as_forged_whatever_their_age(
    keyring: Keyring, command: Callable[..., Any]
) -> None:
    doc = command(ts_ms=NOW - 60 * MIN, secret="forged-secret-0123456789")
    assert code_of(keyring, raw(doc)) == "bad_signature"


@pytest.mark.parametrize(
    ("offset_ms", "code"),
    [
        (-5 * MIN - 1, "stale"),
        (-5 * MIN, None),
        (0, None),
        (5 * MIN, None),
        (5 * MIN + 1, "future"),
    ],
)
def test_the_freshness_window_is_five_minutes_each_way(
    keyring: Keyring, command: Callable[..., Any], offset_ms: int, code: str | None
) -> None:
    assert code_of(keyring, raw(command(ts_ms=NOW + offset_ms))) == code


def test_a_retired_key_is_refused_from_its_retirement_on(
    keyring: Keyring, command: Callable[..., Any]
) -> None:
    keyring.retire("ops", NOW + 1)
    assert code_of(keyring, raw(command(key_id="ops"))) is None
    assert code_of(keyring, raw(command(key_id="ops", ts_ms=NOW + 1)), NOW + 1) == "key_expired"


def test_a_key_past_not_after_is_refused(command: Callable[..., Any]) -> None:
    from tailguard.admin.keys import parse_keyring

    ring = parse_keyring(
        'old: {role: admin, secret: "old-secret-0123456789", not_after: 2020-01-01T00:00:00Z}'
    )
    assert code_of(ring, raw(command(key_id="old", secret="old-secret-0123456789"))) == (
        "key_expired"
    )


@pytest.mark.parametrize(
    ("key_id", "needs", "ok"),
    [
        ("view", Role.viewer, True),
        ("view", Role.operator, False),
        ("ops", Role.operator, True),
        ("ops", Role.admin, False),
        ("root", Role.admin, True),
        ("root", Role.viewer, True),
    ],
)
def test_roles_are_ordered(
    keyring: Keyring, command: Callable[..., Any], key_id: str, needs: Role, ok: bool
) -> None:
    _, verdict = authenticate(raw(command(key_id=key_id)), keyring, NOW)
    assert isinstance(verdict, Verified)
    refusal = authorise(verdict, "some.action", needs)
    assert (refusal is None) == ok
    if not ok:
        assert refusal is not None and refusal.code == "forbidden"
        assert needs.name in refusal.message


def test_a_key_bound_to_an_actor_cannot_act_for_another(
    keyring: Keyring, command: Callable[..., Any]
) -> None:
    for actor, ok in (("alice", True), ("mallory", False)):
        _, verdict = authenticate(raw(command(key_id="alice-key", actor=actor)), keyring, NOW)
        assert isinstance(verdict, Verified)
        assert (authorise(verdict, "slo.set", Role.admin) is None) == ok


def test_a_seen_command_id_from_another_message_is_a_replay() -> None:
    seen = SeenEntry(ts_ms=NOW, partition=0, offset=7)
    refusal = replay_check(seen, "c-1", 0, 9)
    assert refusal is not None and refusal.code == "replayed"


def test_a_redelivery_of_the_same_message_is_not_a_replay() -> None:
    assert replay_check(SeenEntry(NOW, 0, 7), "c-1", 0, 7) is None
    assert replay_check(None, "c-1", 0, 7) is None


def test_seen_entries_are_forgotten_once_a_copy_would_be_stale() -> None:
    window = ReplayWindow()
    assert not window.forgettable(NOW, NOW + 5 * MIN)
    assert window.forgettable(NOW, NOW + 5 * MIN + 1)


def test_seen_entries_round_trip_through_bytes() -> None:
    entry = SeenEntry(NOW, 0, 123)
    assert SeenEntry.from_bytes(entry.to_bytes()) == entry


def test_every_refusal_code_is_documented() -> None:
    assert {"malformed", "unsigned", "bad_signature", "replayed", "forbidden"} <= set(CODES)


def test_a_huge_message_is_malformed(keyring: Keyring, command: Callable[..., Any]) -> None:
    doc = command(args={"blob": "x" * 300_000})
    assert code_of(keyring, json.dumps(doc).encode()) == "malformed"
