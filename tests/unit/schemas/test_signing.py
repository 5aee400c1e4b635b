"""Admin command signatures: RFC 8785 canonical JSON and HMAC-SHA256."""

import hashlib
import hmac
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tailguard.schemas.signing import SignatureError, canonical_json, sign, signed, verify

SECRET = b"0123456789abcdef-secret"
COMMAND = {
    "schema": "tailguard.admin.v1",
    "command_id": "c-1",
    "ts_ms": 1_700_000_000_000,
    "actor": "alice",
    "key_id": "ops",
    "action": "slo.set",
    "args": {"name": "ttft-p99", "target": 0.995, "note": "café"},
}


def test_canonical_json_sorts_keys_drops_whitespace_and_the_signature() -> None:
    body = canonical_json({**COMMAND, "signature": "ff" * 32})
    assert body == (
        b'{"action":"slo.set","actor":"alice","args":{"name":"ttft-p99","note":"caf\xc3\xa9",'
        b'"target":0.995},"command_id":"c-1","key_id":"ops","schema":"tailguard.admin.v1",'
        b'"ts_ms":1700000000000}'
    )


def test_numbers_are_written_as_ecmascript_does() -> None:
    assert canonical_json({"a": 1.0, "b": 1e-7, "c": 1e21, "d": -0.0}) == (
        b'{"a":1,"b":1e-7,"c":1e+21,"d":0}'
    )


def test_the_signature_is_hex_hmac_sha256_of_the_canonical_json() -> None:
    expected = hmac.new(SECRET, canonical_json(COMMAND), hashlib.sha256).hexdigest()
    assert sign(COMMAND, SECRET) == expected
    assert signed(COMMAND, SECRET)["signature"] == expected


def test_a_signed_command_verifies_whatever_its_layout_on_the_wire() -> None:
    doc = signed(COMMAND, SECRET)
    pretty = json.loads(json.dumps(doc, indent=4, sort_keys=False))
    reordered = dict(reversed(list(pretty.items())))
    assert verify(reordered, SECRET)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: d.update(action="key.revoke"),
        lambda d: d["args"].update(target=0.5),
        lambda d: d.update(ts_ms=d["ts_ms"] + 1),
        lambda d: d.update(extra="field"),  # unknown fields are covered too
        lambda d: d.pop("schema"),
    ],
)
def test_any_change_breaks_the_signature(tamper: object) -> None:
    doc = json.loads(json.dumps(signed(COMMAND, SECRET)))
    tamper(doc)  # type: ignore[operator]
    assert not verify(doc, SECRET)


def test_another_secret_does_not_verify() -> None:
    assert not verify(signed(COMMAND, SECRET), b"another-secret-of-16+bytes")


@pytest.mark.parametrize("sig", [None, "", "zz" * 32, "ab" * 31, 42, "AB" * 33])
def test_missing_or_malformed_signatures_are_not_valid(sig: object) -> None:
    assert not verify({**COMMAND, "signature": sig}, SECRET)


def test_upper_case_hex_is_accepted() -> None:
    doc = signed(COMMAND, SECRET)
    assert verify({**doc, "signature": doc["signature"].upper()}, SECRET)


def test_numbers_without_a_canonical_form_cannot_be_signed() -> None:
    with pytest.raises(SignatureError, match="canonical"):
        sign({**COMMAND, "args": {"n": 2**60}}, SECRET)


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(args=st.dictionaries(st.text(max_size=6), _json, max_size=5))
def test_sign_then_json_round_trip_verifies(args: dict[str, object]) -> None:
    doc = signed({**COMMAND, "args": args}, SECRET)
    assert verify(json.loads(json.dumps(doc)), SECRET)
