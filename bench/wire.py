"""What the input encoding costs before the fold: rows of JSON objects against columns.

    python -m bench.wire

Today a worker decodes each message into validated ``InferenceEvent`` objects
(``decode``) and then reads them back, field by field, into the columns it
folds (``group``: series of every event, its home partition, columns grouped
by series). Both are per-event Python work. This measures them on the
benchmark's own 100,000 requests (10,000 series) against the same requests
sent as columns — one JSON object per message holding one array per field
and its series once each (requests name theirs by index) — decoded by msgspec
straight into lists and then numpy arrays, with the checks of the numeric
fields done on the arrays and one argsort grouping the batch by series. That second path is
a measurement of the design, not something a worker accepts yet: it carries
only the fields the fold reads. Writes ``bench/results/wire.json``.
"""

import gc
import json
import time
from itertools import repeat
from typing import Any

import msgspec
import numpy as np
from tailguard.agents.internal import group_by_partition, series_index
from tailguard.schemas import Limits, decode
from tailguard.streams.columns import STATUS_CODES, event_hashes

from bench.common import machine, write_result
from bench.throughput import make_placed_messages

MESSAGES = 500  # one ingest batch: 100,000 requests
ROUNDS = 5

_FIELDS = ("event_id", "ts_ms", "status", "e2e_ms", "ttft_ms", "output_tokens", "trace_id")


class _Requests(msgspec.Struct):
    series: list[int]  # index into the message's ``series``
    event_id: list[str]
    ts_ms: list[int]
    status: list[str]
    e2e_ms: list[float]
    ttft_ms: list[float | None]
    output_tokens: list[int | None]
    trace_id: list[str | None]
    itl_len: list[int]
    itl_ms: list[float]


class _Message(msgspec.Struct):
    #: ``[service, model, variant, tenant]`` of each series the message holds.
    series: list[tuple[str, str, str, str]]
    requests: _Requests


def as_columns(raw: bytes) -> bytes:
    """The requests of one row message as one array per field (series as indices)."""
    series: dict[tuple[str, str, str, str], int] = {}
    cols: dict[str, list[Any]] = {name: [] for name in ("series", *_FIELDS, "itl_len", "itl_ms")}
    for ev in json.loads(raw):
        key = (
            ev["service"],
            ev["model"],
            ev.get("variant") or "default",
            ev.get("tenant") or "default",
        )
        cols["series"].append(series.setdefault(key, len(series)))
        for name in _FIELDS:
            cols[name].append(ev.get(name))
        gaps = ev.get("itl_ms") or []
        cols["itl_len"].append(len(gaps))
        cols["itl_ms"].extend(gaps)
    return msgspec.json.encode({"series": list(series), "requests": cols})


def rows(msgs: list[tuple[int, bytes]], now: int, limits: Limits) -> int:
    """Today's path: typed decode, then grouping into columns."""
    valid, positions = [], []
    for offset, (part, raw) in enumerate(msgs):
        decoded = decode(raw, "inference", now_ms=now, limits=limits).valid
        valid.extend(decoded)
        positions.extend([(part, offset)] * len(decoded))
    group_by_partition(valid, positions, series_index(valid), np.arange(len(valid)))
    return len(valid)


_decode_columns = msgspec.json.Decoder(_Message).decode


def columns(msgs: list[bytes], now: int, limits: Limits) -> int:
    """Columns on the wire: decoded into arrays, checked on the arrays, grouped by
    series with one stable argsort over the batch."""
    index: dict[tuple[str, str, str, str], int] = {}
    gids: list[np.ndarray] = []
    kept: list[Any] = []
    n = 0
    for raw in msgs:
        message = _decode_columns(raw)
        r = message.requests
        lut = np.array([index.setdefault(s, len(index)) for s in message.series], dtype=np.int64)
        ts = np.array(r.ts_ms, dtype=np.int64)
        e2e = np.array(r.e2e_ms, dtype=np.float64)
        ttft = np.array(r.ttft_ms, dtype=np.float64)
        gaps = np.array(r.itl_ms, dtype=np.float64)
        # What the row path checks of these fields: future timestamps, negative,
        # NaN or absurd durations (absent TTFTs are NaN here).
        bad = (ts > now + limits.max_future_skew_ms) | ~(e2e >= 0) | (ttft < 0)
        bad |= e2e > limits.max_duration_ms
        owner = np.repeat(np.arange(ts.size), r.itl_len)
        bad[owner[~(gaps >= 0) | (gaps > limits.max_duration_ms)]] = True
        # The rest of what the fold reads (streams/columns.py), as the row path builds it.
        ids = event_hashes(r.event_id)
        status = np.fromiter(map(STATUS_CODES.get, r.status, repeat(4)), np.uint8, ts.size)
        tokens = np.array(r.output_tokens, dtype=np.float64)
        tokens = np.where(np.isnan(tokens), -1, tokens).astype(np.int64)
        traces = [trace or "" for trace in r.trace_id]
        gids.append(lut[np.array(r.series, dtype=np.int64)][~bad])
        kept.append((ids[~bad], status[~bad], tokens[~bad], len(traces)))
        n += int(ts.size - bad.sum())
    np.argsort(np.concatenate(gids), kind="stable")
    return n


def main() -> None:
    msgs = make_placed_messages(MESSAGES * 200, 10_000)[:MESSAGES]
    placed = [(int(part or 0), raw) for part, raw in msgs]
    as_cols = [as_columns(raw) for _, raw in placed]
    now, limits = int(time.time() * 1000), Limits()
    best = {"rows": float("inf"), "columns": float("inf")}
    events = 0
    for _ in range(ROUNDS):
        for name in best:
            gc.collect()
            gc.disable()  # as the ingest agent decodes a batch
            started = time.perf_counter()
            events = rows(placed, now, limits) if name == "rows" else columns(as_cols, now, limits)
            best[name] = min(best[name], (time.perf_counter() - started) / events)
            gc.enable()
    result = {
        "events": events,
        "series": 10_000,
        "us_per_event": {name: round(s * 1e6, 2) for name, s in best.items()},
        "bytes_per_event": {
            "rows": round(sum(len(r) for _, r in placed) / events, 1),
            "columns": round(sum(len(r) for r in as_cols) / events, 1),
        },
        "note": "rows: decode + group (what a worker does today); columns: a design measurement",
        "machine": machine("in-process, no Kafka, one core"),
        "command": "python -m bench.wire",
    }
    write_result("wire", result)
    print(json.dumps(result, indent=2), flush=True)


if __name__ == "__main__":
    main()
