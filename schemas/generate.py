"""Write the JSON Schema file of every record: ``python -m tailguard.schemas.generate``.

Producers that are not written in Python validate what they send against
these files, so they are generated from the Structs in
:mod:`tailguard.schemas.inputs` and :mod:`tailguard.schemas.outputs` and
shipped as package data in ``jsonschema/<schema id>.json``. A unit test
regenerates them and compares, so the files cannot drift from the code.
Output is deterministic: sorted keys, two-space indent, one trailing newline.

Each file is JSON Schema draft 2020-12 with ``$id`` = the schema id:

- an input file describes a whole Kafka message value: ``oneOf`` one event
  object or an array (batch) of at most ``max_batch_events`` of them; the
  event alone is ``#/$defs/<Record>``;
- an output file describes one record.

The rules a schema cannot state (``ttft_ms`` ≤ ``e2e_ms``; durations at most
1 h; ``ts_ms`` at most 5 minutes in the future; message size and depth) are
listed in each input file's ``description`` and checked by the codec.

Usage::

    python -m tailguard.schemas.generate            # (re)write the files
    python -m tailguard.schemas.generate --check    # exit 1 if a file is stale
"""

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import msgspec
from tailguard.schemas.columnar import COLUMNS_SCHEMA_ID, InferenceColumns
from tailguard.schemas.inputs import INPUT_RECORDS
from tailguard.schemas.limits import DEFAULT_LIMITS
from tailguard.schemas.outputs import OUTPUT_RECORDS
from tailguard.schemas.prompts import PROMPT_SCHEMA, PROMPT_SLI_SCHEMA, PromptGroupSli, PromptRecord
from tailguard.schemas.records import SCHEMA_IDS

__all__ = [
    "RECORD_DOCUMENTS",
    "SCHEMA_DIR",
    "build_all",
    "build_record_document",
    "build_schema",
    "main",
    "render",
]

#: Where the shipped files live (package data of ``tailguard.schemas``).
SCHEMA_DIR: Final = Path(__file__).resolve().parent / "jsonschema"
DRAFT: Final = "https://json-schema.org/draft/2020-12/schema"

_LIMITS = DEFAULT_LIMITS
_RUNTIME_RULES: Final = (
    "Checked by tailguard beyond this schema (default limits): the message is at most "
    f"{_LIMITS.max_message_bytes} bytes of UTF-8 and nests at most {_LIMITS.max_depth} "
    "levels; ts_ms is at most "
    f"{_LIMITS.max_future_skew_ms} ms ahead of the consumer's clock; every duration "
    f"(*_ms, each itl_ms gap, each stages_ms value) is at most {_LIMITS.max_duration_ms:.0f} "
    "ms. Unknown fields are ignored. An event that breaks a rule goes to "
    "tailguard.deadletter; the other events of its batch are kept."
)
_EXTRA_RULES: Final[dict[str, str]] = {
    "inference": (
        " Also: ttft_ms is required when output_tokens >= 1 and is at most e2e_ms; "
        f"itl_ms has at most {_LIMITS.max_itl_len} gaps; cache.prefix_hit_tokens is at most "
        "cache.prefix_query_tokens."
    ),
    "gpu": " Also: mem_used_mib is at most mem_total_mib.",
    "kv": (
        " Also: free_blocks is at most total_blocks, and each sequence's tokens fit in its "
        "blocks (tokens <= blocks * block_size)."
    ),
}


def _record_schema(record: type[msgspec.Struct]) -> tuple[dict[str, Any], dict[str, Any]]:
    (ref,), defs = msgspec.json.schema_components([record], ref_template="#/$defs/{name}")
    return ref, defs


def _add_inference_rules(defs: dict[str, Any]) -> None:
    # "ttft_ms is required when output_tokens >= 1", as a JSON Schema conditional.
    defs["InferenceEvent"]["if"] = {
        "properties": {"output_tokens": {"type": "integer", "minimum": 1}},
        "required": ["output_tokens"],
    }
    defs["InferenceEvent"]["then"] = {
        "properties": {"ttft_ms": {"type": "number"}},
        "required": ["ttft_ms"],
    }


def build_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema document of topic kind ``kind`` (an input or an output)."""
    schema_id = SCHEMA_IDS[kind]
    if kind in INPUT_RECORDS:
        record: type[msgspec.Struct] = INPUT_RECORDS[kind]
        ref, defs = _record_schema(record)
        if kind == "inference":
            _add_inference_rules(defs)
        return {
            "$schema": DRAFT,
            "$id": schema_id,
            "title": schema_id,
            "description": (
                f"A Kafka message value of {schema_id}: one event object, or an array (a batch) "
                f"of at most {_LIMITS.max_batch_events} event objects. To validate one event, "
                f"use #/$defs/{record.__name__}. " + _RUNTIME_RULES + _EXTRA_RULES.get(kind, "")
            ),
            "oneOf": [
                ref,
                {"type": "array", "items": ref, "maxItems": _LIMITS.max_batch_events},
            ],
            "$defs": defs,
        }
    record = OUTPUT_RECORDS[kind]
    ref, defs = _record_schema(record)
    body = defs[record.__name__]
    body["required"] = sorted({"schema", *body.get("required", [])})
    return {
        "$schema": DRAFT,
        "$id": schema_id,
        "title": schema_id,
        "description": (
            f"One {schema_id} record, the value of a Kafka message framed as a binary-mode "
            "CloudEvent (headers ce_specversion, ce_id, ce_source, ce_type = this schema id, "
            "ce_time, content-type). Subscribers should ignore fields they do not know."
        ),
        "$ref": ref["$ref"],
        "$defs": defs,
    }


#: Records of single-record topics defined beside ``records`` (schema id → Struct).
RECORD_DOCUMENTS: Final[dict[str, tuple[type[msgspec.Struct], str]]] = {
    COLUMNS_SCHEMA_ID: (
        InferenceColumns,
        "A Kafka message value of tailguard.inference in the columnar form: the series of "
        "its requests listed once, and one array per field of tailguard.inference.v1 with "
        "one entry per request (null: the field's default); requests.series indexes "
        "series; itl_len holds each request's number of gaps and itl_ms all gaps, "
        "concatenated. event_id, ts_ms, status and e2e_ms are required columns. Each "
        "request is judged as the tailguard.inference.v1 object it stands for (its rules, "
        "limits and dead-letter reasons); columns whose lengths disagree refuse the "
        "message whole. " + _RUNTIME_RULES + _EXTRA_RULES["inference"],
    ),
    PROMPT_SCHEMA: (
        PromptRecord,
        "One prompt version on the compacted topic tailguard.prompts (key: prompt_version). "
        "At least one of text and text_sha256; when both, text_sha256 is the SHA-256 of text.",
    ),
    PROMPT_SLI_SCHEMA: (
        PromptGroupSli,
        "One SLI snapshot of a (service, model, prompt group) on tailguard.prompt_sli, framed "
        "as a binary-mode CloudEvent. Subscribers should ignore fields they do not know.",
    ),
}


def build_record_document(schema_id: str) -> dict[str, Any]:
    """The JSON Schema document of one record of :data:`RECORD_DOCUMENTS`."""
    record, description = RECORD_DOCUMENTS[schema_id]
    ref, defs = _record_schema(record)
    if record is PromptRecord:  # "text or text_sha256", as a JSON Schema
        defs["PromptRecord"]["anyOf"] = [
            {"required": [name], "properties": {name: {"type": "string"}}}
            for name in ("text", "text_sha256")
        ]
    return {
        "$schema": DRAFT,
        "$id": schema_id,
        "title": schema_id,
        "description": description,
        "$ref": ref["$ref"],
        "$defs": defs,
    }


def render(document: dict[str, Any]) -> str:
    """The exact text written for a schema document."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def build_all() -> dict[str, str]:
    """File name → file text, for every input and output record."""
    kinds = [*INPUT_RECORDS, *OUTPUT_RECORDS]
    files = {f"{SCHEMA_IDS[kind]}.json": render(build_schema(kind)) for kind in kinds}
    files.update({f"{sid}.json": render(build_record_document(sid)) for sid in RECORD_DOCUMENTS})
    return files


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or with ``--check`` compare) the schema files; 0 when all is well."""
    parser = argparse.ArgumentParser(prog="python -m tailguard.schemas.generate")
    parser.add_argument("--out", type=Path, default=SCHEMA_DIR, help="target directory")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if any file differs"
    )
    args = parser.parse_args(argv)
    out: Path = args.out
    stale = []
    for name, text in build_all().items():
        path = out / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print(
            f"stale JSON Schema files in {out}: {', '.join(stale)}; "
            "run python -m tailguard.schemas.generate",
            file=sys.stderr,
        )
        return 1
    verb = "would write" if args.check else "wrote"
    print(f"{verb} {len(stale)} file(s) in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
