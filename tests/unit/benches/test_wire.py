"""The columnar encoding ``bench.wire`` measures holds the same requests as the rows."""

import json
import time

import msgspec
from tailguard.schemas import Limits

from bench.wire import as_columns, columns, rows


def _request(i: int, **fields: object) -> dict[str, object]:
    return {
        "event_id": f"e{i}",
        "ts_ms": int(time.time() * 1000) - 60_000 + i,
        "service": f"svc{i % 3}",
        "model": "m",
        "status": "ok",
        "ttft_ms": 100.0 + i,
        "e2e_ms": 400.0 + i,
        "output_tokens": 4,
        "itl_ms": [10.0, 11.0, 12.0],
        **fields,
    }


def test_columns_keep_every_request_and_each_series_once() -> None:
    raw = json.dumps([_request(i) for i in range(9)]).encode()
    message = msgspec.json.decode(as_columns(raw))
    assert len(message["series"]) == 3
    assert message["requests"]["series"] == [i % 3 for i in range(9)]
    assert message["requests"]["itl_ms"] == [10.0, 11.0, 12.0] * 9
    now = int(time.time() * 1000)
    assert columns([as_columns(raw)], now, Limits()) == rows([(0, raw)], now, Limits()) == 9


def test_the_array_checks_drop_what_the_row_path_rejects() -> None:
    bad = [_request(0, e2e_ms=-1.0), _request(1, itl_ms=[5.0, -2.0]), _request(2)]
    raw = json.dumps(bad).encode()
    now = int(time.time() * 1000)
    assert columns([as_columns(raw)], now, Limits()) == rows([(0, raw)], now, Limits()) == 1
