"""The record types: ids, registry, output framing, digests subscribers can load."""

import json
import subprocess
import sys
from typing import Any

import msgspec
import tdigest
from tailguard.schemas import (
    INPUT_RECORDS,
    OUTPUT_RECORDS,
    REGISTRY,
    SCHEMA_IDS,
    Centroid,
    DeadLetter,
    DeadLetterReason,
    InferenceEvent,
    PercentileSummary,
    Series,
    SliSnapshot,
    TDigestDict,
    encode,
)


def _sli(**overrides: Any) -> SliSnapshot:
    empty = PercentileSummary()
    fields: dict[str, Any] = {
        "event_id": "sli-1",
        "ts_ms": 1_700_000_100_000,
        "series": Series(service="chat", model="llama"),
        "window_s": 300,
        "window_end_ms": 1_700_000_100_000,
        "count": 0,
        "errors": 0,
        "ttft_ms": empty,
        "tpot_ms": empty,
        "itl_ms": empty,
        "e2e_ms": empty,
        "goodput_rps": 0.0,
        "slo_compliance": None,
    }
    fields.update(overrides)
    return SliSnapshot(**fields)


def test_every_record_is_registered_under_its_schema_id() -> None:
    for kind, record in {**INPUT_RECORDS, **OUTPUT_RECORDS}.items():
        assert REGISTRY[SCHEMA_IDS[kind]] is record
    assert len(REGISTRY) == len(INPUT_RECORDS) + len(OUTPUT_RECORDS)
    assert all(schema_id.startswith("tailguard.") for schema_id in SCHEMA_IDS.values())


def test_every_input_accepts_only_its_own_schema_id() -> None:
    for kind, record in INPUT_RECORDS.items():
        field = next(f for f in msgspec.structs.fields(record) if f.name == "schema")
        assert field.default is None
        assert msgspec.convert(SCHEMA_IDS[kind], field.type) == SCHEMA_IDS[kind]


def test_outputs_always_carry_schema_event_id_and_ts_ms() -> None:
    body = json.loads(encode(_sli()))
    assert (body["schema"], body["event_id"], body["ts_ms"]) == (
        "tailguard.sli.v1",
        "sli-1",
        1_700_000_100_000,
    )
    assert body["series"] == {
        "service": "chat",
        "model": "llama",
        "variant": "default",
        "tenant": "default",
    }
    assert body["ttft_ms"] == {
        "p50": None,
        "p90": None,
        "p95": None,
        "p99": None,
        "p999": None,
        "count": 0,
    }
    assert body["digests"] is None  # outputs write nulls rather than leave fields out


def test_a_published_digest_loads_into_the_tdigest_package() -> None:
    digest = TDigestDict(
        n=4, delta=0.01, K=25, centroids=[Centroid(m=m, c=1.0) for m in (1.0, 2.0, 3.0, 4.0)]
    )
    body = json.loads(encode(_sli(digests={"ttft_ms": digest})))
    loaded = tdigest.TDigest()
    loaded.update_from_dict(body["digests"]["ttft_ms"])
    assert loaded.n == 4
    assert 2.0 <= loaded.percentile(50) <= 3.0
    bare = json.loads(encode(TDigestDict(centroids=[])))
    assert bare == {"centroids": []}  # unset tdigest options are left out, not null


def test_input_records_omit_defaults_when_encoded() -> None:
    event = InferenceEvent(event_id="e", ts_ms=1, service="s", model="m", status="ok", e2e_ms=1.0)
    assert json.loads(encode(event)) == {
        "event_id": "e",
        "ts_ms": 1,
        "service": "s",
        "model": "m",
        "status": "ok",
        "e2e_ms": 1.0,
    }


def test_dead_letter_reason_encodes_as_its_value() -> None:
    letter = DeadLetter(
        event_id="x",
        ts_ms=1,
        topic="t",
        partition=0,
        offset=0,
        reason=DeadLetterReason.TOO_DEEP,
        detail="d",
        original_b64="",
        original_size=0,
    )
    assert json.loads(encode(letter))["reason"] == "too_deep"
    assert msgspec.json.decode(encode(letter), type=DeadLetter) == letter


def test_importing_the_schemas_loads_no_stream_or_kafka_library() -> None:
    code = (
        "import sys, tailguard.schemas\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('faust', 'mode', 'aiokafka', 'confluent_kafka', 'numpy', 'jsonschema')]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
