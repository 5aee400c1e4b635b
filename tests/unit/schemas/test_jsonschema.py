"""The shipped JSON Schema files: fresh, valid, and in step with the codec."""

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tailguard.schemas import (
    SCHEMA_IDS,
    DeadLetterReason,
    PercentileSummary,
    Reject,
    Series,
    SliSnapshot,
    TDigestDict,
    dead_letter,
    decode,
    encode,
)
from tailguard.schemas.generate import SCHEMA_DIR, build_all, main
from tailguard.schemas.inputs import INPUT_RECORDS, InferenceEvent

NOW_MS = 1_700_000_100_000


def _validator(kind: str) -> jsonschema.Draft202012Validator:
    path = SCHEMA_DIR / f"{SCHEMA_IDS[kind]}.json"
    return jsonschema.Draft202012Validator(json.loads(path.read_text(encoding="utf-8")))


def test_shipped_files_equal_freshly_generated_ones() -> None:
    fresh = build_all()
    shipped = {p.name: p.read_text(encoding="utf-8") for p in SCHEMA_DIR.glob("*.json")}
    assert sorted(shipped) == sorted(fresh), "run python -m tailguard.schemas.generate"
    for name, text in fresh.items():
        assert shipped[name] == text, f"{name} is stale: run python -m tailguard.schemas.generate"


def test_generate_writes_then_checks_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    assert main(["--out", str(tmp_path), "--check"]) == 0
    stale = tmp_path / "tailguard.kv.v1.json"
    stale.write_text("{}\n", encoding="utf-8")
    assert main(["--out", str(tmp_path), "--check"]) == 1
    assert "tailguard.kv.v1.json" in capsys.readouterr().err
    assert stale.read_text(encoding="utf-8") == "{}\n"  # --check writes nothing


@pytest.mark.parametrize("name", sorted(build_all()))
def test_each_file_is_a_draft_2020_12_schema_named_by_its_id(name: str) -> None:
    schema = json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert f"{schema['$id']}.json" == name


@pytest.mark.parametrize("kind", list(INPUT_RECORDS))
def test_example_events_and_batches_validate(make_event: Any, kind: str) -> None:
    validator = _validator(kind)
    event = make_event(kind)
    validator.validate(event)
    validator.validate([event, event])
    validator.validate([])
    validator.validate({**event, "schema": SCHEMA_IDS[kind], "field_from_the_future": [1]})


@pytest.mark.parametrize(
    ("overrides", "without"),
    [
        ({}, ("e2e_ms",)),  # a required field missing
        ({"e2e_ms": "slow"}, ()),  # wrong type
        ({"e2e_ms": True}, ()),  # a bool is not a number
        ({"ttft_ms": -1}, ()),  # negative duration
        ({"itl_ms": [1, -2]}, ()),  # negative gap
        ({"status": "done"}, ()),  # not in the enumeration
        ({"schema": "tailguard.inference.v2"}, ()),  # unknown schema version
        ({"trace_id": "ABC"}, ()),  # not a W3C trace id
        ({"output_tokens": -1}, ()),  # negative count
        ({"output_tokens": 3}, ("ttft_ms",)),  # ttft_ms required when output_tokens >= 1
        ({"cache": {"prefix_hit_tokens": 1}}, ()),  # nested required field
    ],
)
def test_invalid_inference_events_are_refused(
    make_event: Any, overrides: dict[str, Any], without: tuple[str, ...]
) -> None:
    validator = _validator("inference")
    bad = make_event(without=without, **overrides)
    assert not validator.is_valid(bad)
    assert not validator.is_valid([make_event(), bad])
    assert decode(json.dumps(bad).encode(), "inference", now_ms=NOW_MS).rejects


def test_a_message_that_is_neither_object_nor_array_is_refused() -> None:
    validator = _validator("inference")
    assert not validator.is_valid("event")
    assert not validator.is_valid([1])


def test_outputs_validate_against_their_schemas() -> None:
    empty = PercentileSummary()
    sli = SliSnapshot(
        event_id="sli:chat/llama/b/acme:60:1700000100000",
        ts_ms=NOW_MS,
        series=Series(service="chat", model="llama", variant="b", tenant="acme"),
        window_s=60,
        window_end_ms=NOW_MS,
        count=10,
        errors=0,
        ttft_ms=PercentileSummary(p50=1.0, p90=2.0, p95=3.0, p99=4.0, p999=5.0, count=10),
        tpot_ms=empty,
        itl_ms=empty,
        e2e_ms=empty,
        goodput_rps=0.16,
        slo_compliance=1.0,
        digests={"ttft_ms": TDigestDict(centroids=[])},
    )
    _validator("sli").validate(json.loads(encode(sli)))
    letter = dead_letter(
        Reject(DeadLetterReason.MALFORMED_JSON, "JSON is malformed"),
        b"{",
        topic="tailguard.inference",
        partition=0,
        offset=7,
        now_ms=NOW_MS,
    )
    _validator("deadletter").validate(json.loads(encode(letter)))
    assert not _validator("deadletter").is_valid({**json.loads(encode(letter)), "reason": "x"})


# Anything tailguard accepts must be valid under the schema it ships (the schema
# is never stricter than the codec), so producers that validate never lose events.
_numbers = st.one_of(
    st.integers(min_value=-5, max_value=2**54),
    st.floats(min_value=-5.0, max_value=5e6, allow_nan=False),
    st.none(),
    st.text(max_size=3),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    changes=st.dictionaries(
        st.sampled_from(sorted(InferenceEvent.__struct_fields__)), _numbers, max_size=3
    )
)
def test_what_decode_accepts_the_schema_accepts(make_event: Any, changes: dict[str, Any]) -> None:
    event = make_event(**changes)
    if decode(json.dumps(event).encode(), "inference", now_ms=NOW_MS).valid:
        _validator("inference").validate(event)
