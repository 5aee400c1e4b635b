"""The benchmarks' input: inference requests of many series, as this project's producers send them.

Event time advances ``PER_MS`` requests a millisecond (a 100,000 requests/s
service); each request has 9 ITL gaps, a trace id, a host and a GPU; messages
hold ``PER_MESSAGE`` requests of one home partition (or of any partition), in
the columnar form or as rows; closing requests follow, past every series' last
bucket and the lateness, so every minute closes.
"""

import time
from typing import Any

import msgspec
import numpy as np
from tailguard.schemas.columnar import encode_columns
from tailguard.schemas.placement import home_partition, series_key_of

__all__ = [
    "LATENESS_MS",
    "PARTITIONS",
    "PER_MESSAGE",
    "PER_MS",
    "make_messages",
    "make_placed_messages",
    "make_placed_workload",
    "series_fields",
]

#: Requests per millisecond of event time (100 = a 100,000 requests/s service).
PER_MS = 100
LATENESS_MS = 120_000
PER_MESSAGE = 200
PARTITIONS = 4


def series_fields(s: int, series: int) -> dict[str, str]:
    return {
        "service": f"svc{s % 10}",
        "model": f"m{(s // 10) % 10}",
        "tenant": f"t{s // 100}",
        "variant": "control" if s < series // 2 else "treatment",
    }


def make_messages(n: int, series: int, seed: int = 1) -> list[bytes]:
    """``n`` requests at 100 per ms of event time, then closing requests (messages of
    random series; see :func:`make_placed_messages`)."""
    return [value for _, value in make_placed_messages(n, series, seed, partitions=None)]


Placed = list[tuple[int | None, bytes]]


def make_placed_messages(
    n: int,
    series: int,
    seed: int = 1,
    partitions: int | None = PARTITIONS,
    encoding: str = "rows",
    now_ms: int | None = None,
) -> Placed:
    """:func:`make_messages` as ``(partition, message)``: with ``partitions``, every
    message holds up to ``PER_MESSAGE`` events of one home partition, in event
    time order; without, ``PER_MESSAGE`` consecutive events and no partition (but
    the closing requests: one per series on each of the ``PARTITIONS`` partitions,
    which all feed every series then). ``now_ms``: the clock the event times
    are placed before (None: now)."""
    requests, closing = make_placed_workload(n, series, seed, partitions, encoding, now_ms)
    return requests + closing


def make_placed_workload(
    n: int,
    series: int,
    seed: int = 1,
    partitions: int | None = PARTITIONS,
    encoding: str = "rows",
    now_ms: int | None = None,
) -> tuple[Placed, Placed]:
    """:func:`make_placed_messages` in two parts: the ``n`` requests, and the
    messages of the closing requests after them (a benchmark sends those once the
    requests are folded, to time the close of their minute alone)."""
    rng = np.random.default_rng(seed)
    encode = msgspec.json.Encoder().encode if encoding == "rows" else encode_columns
    # The minute the events fill ends on a 5-minute boundary: the close then
    # publishes final 1m, 5m and 1h snapshots (the costliest close), every run.
    now = int(time.time() * 1000) if now_ms is None else now_ms
    start = (now - 1_800_000) // 300_000 * 300_000 + 240_000
    ttft = rng.lognormal(np.log(180), 0.45, n)
    gaps = rng.lognormal(np.log(30), 0.35, (n, 9)).round(2)
    sid = rng.integers(0, series, n)
    names = [series_fields(s, series) for s in range(series)]
    home = [
        None if partitions is None else home_partition(series_key_of(f), partitions) for f in names
    ]
    msgs: Placed = []
    open_: dict[int | None, list[dict[str, Any]]] = {}

    def add(s: int, event: dict[str, Any]) -> None:
        batch = open_.setdefault(home[s], [])
        batch.append(event)
        if len(batch) == PER_MESSAGE:
            msgs.append((home[s], encode(batch)))
            batch.clear()

    def close_all() -> None:
        for part, batch in open_.items():
            if batch:
                msgs.append((part, encode(batch)))
        open_.clear()

    for lo in range(0, n, PER_MESSAGE):
        for i in range(lo, min(n, lo + PER_MESSAGE)):
            itl = gaps[i].tolist()
            add(
                int(sid[i]),
                {
                    "event_id": f"b{i}",
                    "ts_ms": start + i // PER_MS,
                    **names[int(sid[i])],
                    "status": "ok",
                    "ttft_ms": round(float(ttft[i]), 2),
                    "e2e_ms": round(float(ttft[i]) + sum(itl), 2),
                    "output_tokens": 10,
                    "input_tokens": 300,
                    "itl_ms": itl,
                    "trace_id": f"{i:032x}",
                    "host": f"gpu-node-{int(sid[i]) % 16:02d}",
                    "gpu_ids": [int(sid[i]) % 8],
                },
            )
    close_all()
    # Closing requests: past every series' last bucket + lateness, so its minutes close.
    closing = start + n // PER_MS + LATENESS_MS + 120_000

    def closing_request(s: int, event_id: str) -> dict[str, Any]:
        return {
            "event_id": event_id,
            "ts_ms": closing,
            **names[s],
            "status": "ok",
            "ttft_ms": 100.0,
            "e2e_ms": 200.0,
            "output_tokens": 1,
        }

    requests = len(msgs)
    if partitions is not None:
        for s in range(series):
            add(s, closing_request(s, f"close{s}"))
        close_all()
        return msgs[:requests], msgs[requests:]
    # At random every partition feeds every series, and a series' watermark is the
    # lowest of its partitions': one closing request per series on each partition.
    for part in range(PARTITIONS):
        batch = [closing_request(s, f"close{s}-{part}") for s in range(series)]
        for lo in range(0, series, PER_MESSAGE):
            msgs.append((part, encode(batch[lo : lo + PER_MESSAGE])))
    return msgs[:requests], msgs[requests:]
