"""``bench.wire`` reads both forms of the same requests through the ingest agent's code."""

import json
import time

from tailguard.schemas import Limits
from tailguard.schemas.columnar import encode_columns

from bench.wire import decode_and_group


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


def test_both_forms_keep_every_valid_request() -> None:
    requests = [_request(i) for i in range(9)]
    rows = json.dumps(requests).encode()
    now = int(time.time() * 1000)
    columns = encode_columns(requests)
    assert len(columns) < len(rows)
    assert decode_and_group([(0, columns)], now, Limits()) == 9
    assert decode_and_group([(0, rows)], now, Limits()) == 9


def test_a_bad_request_is_left_out_of_either_form() -> None:
    good = [_request(i) for i in range(3)]
    bad = json.dumps([*good, _request(3, ts_ms=int(time.time() * 1000) + 86_400_000)])
    now = int(time.time() * 1000)
    assert decode_and_group([(0, bad.encode())], now, Limits()) == 3
    columns = json.loads(encode_columns(good))
    columns["requests"]["ts_ms"][1] += 86_400_000  # a request from tomorrow
    assert decode_and_group([(0, json.dumps(columns).encode())], now, Limits()) == 2
