"""The requests of a columnar message as rows: records, row objects, and the row
decoder's verdict on them.

A columnar message stands for the row objects a producer would have sent one
by one (:mod:`~tailguard.schemas.columnar_wire`). Readers of the topic (tools,
tests) read them back as such (:func:`rows_of`); the worker rebuilds the few
requests its screen flags as rows and lets the row decoder judge them
(:func:`judge_rows`), so a request is refused with the same reason and detail
whichever form carried it.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import numpy as np
from tailguard.schemas.codec import decode
from tailguard.schemas.columnar_wire import (
    COLUMNS_SCHEMA_ID,
    NUMBER_COLUMNS,
    OPTIONAL,
    SERIES_FIELDS,
    ColumnsDecoded,
    numbers,
)
from tailguard.schemas.inputs import InferenceEvent
from tailguard.schemas.limits import Limits
from tailguard.schemas.rejects import Reject

__all__ = ["events_of", "gap_starts", "judge_rows", "rows_of"]


def events_of(decoded: ColumnsDecoded, rows: list[int] | None = None) -> list[InferenceEvent]:
    """The valid requests of a decoded message (or those at ``rows``) as row records.

    Built without validating again: the decode has checked every value."""
    message = decoded.message
    if message is None:
        return []
    req = message.requests
    n = len(req.event_id)
    if rows is None:
        rows = list(range(n)) if decoded.keep is None else np.flatnonzero(decoded.keep).tolist()
    num = decoded.numbers
    if num is None:
        num = numbers(req, n)
    # The numeric columns are read from the arrays (a batch may have let the
    # lists go, see :func:`without_numbers`), the others from the lists.
    starts = np.r_[0, np.cumsum(num.itl_len)].tolist()
    ts, e2e = num.ts_ms.tolist(), num.e2e_ms.tolist()
    ttft, tokens, gaps = num.ttft_ms, num.output_tokens, num.itl_ms
    present = [
        (name, column)
        for name in OPTIONAL
        if name not in NUMBER_COLUMNS and (column := getattr(req, name)) is not None
    ]
    out = []
    for i in rows:
        fields = dict(zip(SERIES_FIELDS, message.series[req.series[i]], strict=True))
        fields.update(event_id=req.event_id[i], ts_ms=ts[i], status=req.status[i], e2e_ms=e2e[i])
        fields.update((name, column[i]) for name, column in present if column[i] is not None)
        if not np.isnan(ttft[i]):
            fields["ttft_ms"] = float(ttft[i])
        if not np.isnan(tokens[i]):
            fields["output_tokens"] = int(tokens[i])
        if starts[i + 1] > starts[i]:
            fields["itl_ms"] = gaps[starts[i] : starts[i + 1]].tolist()
        out.append(InferenceEvent(**fields))
    return out


def rows_of(raw: bytes) -> list[dict[str, Any]]:
    """The requests of a message of either form as row objects, without checks (for
    readers of the topic: tools and tests). Raises ``msgspec.DecodeError`` for bytes
    that are not JSON, ``ValueError`` for a columnar message whose columns disagree."""
    doc = msgspec.json.decode(raw)
    if not (isinstance(doc, dict) and doc.get("schema") == COLUMNS_SCHEMA_ID):
        return doc if isinstance(doc, list) else [doc]
    try:
        n = len(doc["requests"]["event_id"])
        starts = gap_starts(doc["requests"], n)
        return [_row(doc, i, starts) for i in range(n)]
    except (KeyError, IndexError, TypeError) as exc:
        msg = f"columns disagree: {exc}"
        raise ValueError(msg) from exc


def _row(doc: dict[str, Any], i: int, gap_starts: list[int]) -> dict[str, Any]:
    """Request ``i`` of a plain (decoded, untyped) columnar message as a row object."""
    req = doc["requests"]
    sid = req["series"][i]
    series = doc["series"]
    row: dict[str, Any] = {}
    if isinstance(sid, int) and not isinstance(sid, bool) and 0 <= sid < len(series):
        names = series[sid]
        if isinstance(names, list | tuple) and len(names) == len(SERIES_FIELDS):
            row.update(zip(SERIES_FIELDS, names, strict=True))
    for name, column in req.items():
        if name in ("series", "itl_len", "itl_ms"):
            continue
        value = column[i]
        if value is not None:
            row[name] = value
    gaps = req.get("itl_ms")
    if gaps and gap_starts[i + 1] > gap_starts[i]:  # a request without gaps has none, as a row
        row["itl_ms"] = gaps[gap_starts[i] : gap_starts[i + 1]]
    return row


def gap_starts(req: dict[str, Any], n: int) -> list[int]:
    lengths = req.get("itl_len") or [0] * n
    starts = [0]
    for length in lengths:
        starts.append(starts[-1] + (length if isinstance(length, int) else 0))
    return starts


def _row_bytes(row: dict[str, Any]) -> bytes:
    return json.dumps(row, allow_nan=True, ensure_ascii=False, separators=(",", ":")).encode()


def judge_rows(
    doc: dict[str, Any], rows: list[int], now_ms: int, limits: Limits
) -> tuple[list[Reject], list[Any]]:
    """The row decoder's verdict on the requests at ``rows``: rejects, and the valid
    ones as row objects."""
    starts = gap_starts(doc["requests"], len(doc["requests"]["event_id"]))
    rejects: list[Reject] = []
    valid: list[Any] = []
    for i in rows:
        row = _row(doc, i, starts)
        element = _row_bytes(row)
        verdict = decode(element, "inference", now_ms=now_ms, limits=limits)
        if verdict.rejects:
            first = verdict.rejects[0]
            rejects.append(Reject(first.reason, first.detail, i, element))
        else:
            valid.append(row)
    return rejects, valid
