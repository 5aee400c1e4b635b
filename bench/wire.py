"""What the input encoding costs before the fold: rows of JSON objects against columns.

    python -m bench.wire

A worker reads a message of ``tailguard.inference`` in either form, through
the ingest agent's own code: rows (a JSON array of request objects) are
decoded into validated ``InferenceEvent`` records, columns
(``tailguard.inference.columns.v1``: one array per field, series listed once)
into lists checked as arrays; both are gathered in a
:class:`~tailguard.agents.requests.RequestBatch`, and then grouped per input
partition by series (``columns_by_partition``), as the agent folds them. This
measures both on the benchmark's own 100,000 requests (10,000 series, 500
messages), the same requests in each form: µs per request and bytes per
request. Writes ``bench/results/wire.json``.
"""

import gc
import json
import time

import numpy as np
from tailguard.agents.internal import columns_by_partition
from tailguard.agents.requests import RequestBatch
from tailguard.schemas import Limits, decode
from tailguard.schemas.columnar import decode_columns, is_columnar

from bench.common import machine, write_result
from bench.workload import make_placed_messages

MESSAGES = 500  # one ingest batch: 100,000 requests
ROUNDS = 5


def decode_and_group(msgs: list[tuple[int, bytes]], now: int, limits: Limits) -> int:
    """The ingest agent's decoding and grouping of one batch; the requests kept."""
    batch = RequestBatch()
    for offset, (part, raw) in enumerate(msgs):
        if is_columnar(raw):
            batch.add_columns(part, offset, decode_columns(raw, now_ms=now, limits=limits))
        else:
            batch.add_rows(part, offset, decode(raw, "inference", now_ms=now, limits=limits).valid)
    columns_by_partition(
        batch.columns(), batch.gid, batch.series, batch.served(), np.arange(len(batch))
    )
    return len(batch)


def main() -> None:
    forms = {
        form: [
            (int(part or 0), raw)
            for part, raw in make_placed_messages(MESSAGES * 200, 10_000, encoding=form)[:MESSAGES]
        ]
        for form in ("rows", "columns")
    }
    now, limits = int(time.time() * 1000), Limits()
    best = dict.fromkeys(forms, float("inf"))
    events = 0
    for _ in range(ROUNDS):
        for form, msgs in forms.items():
            gc.collect()
            gc.disable()  # as the ingest agent decodes a batch
            started = time.perf_counter()
            events = decode_and_group(msgs, now, limits)
            best[form] = min(best[form], (time.perf_counter() - started) / events)
            gc.enable()
    result = {
        "events": events,
        "series": 10_000,
        "us_per_event": {form: round(s * 1e6, 2) for form, s in best.items()},
        "bytes_per_event": {
            form: round(sum(len(raw) for _, raw in msgs) / events, 1)
            for form, msgs in forms.items()
        },
        "machine": machine("in-process, no Kafka, one core"),
        "command": "python -m bench.wire",
    }
    write_result("wire", result)
    print(json.dumps(result, indent=2), flush=True)


if __name__ == "__main__":
    main()
