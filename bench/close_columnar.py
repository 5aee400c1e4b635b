"""A design probe: what closing a minute of 10,000 series would cost were the
minute's values arrays across the series of a partition.

    python -m bench.close_columnar

``bench.close`` times the worker's own close, which works series by series
(window reads, summaries, the burn check and the silent detector each in
Python per series: ~115 µs a series on a 2-core machine). This probe holds
the same minute — 10,000 series, 60 requests each with TTFT, TPOT, E2E and
nine ITL gaps, a few failed — as one array per metric ordered by series, and
does the close's arithmetic once for all of them: the five percentiles of
each metric (numpy's linear ones, checked against ``np.percentile`` for a
sample of series), the counters, the burn rates of four SLOs, and the 30,000
``tailguard.sli.v1`` payloads (1m, 5m and 1h: a young series' windows hold
the same minute) encoded from msgspec structs. It is not the product: it
prices the design step before it is taken. Writes
``bench/results/close_columnar.json``.
"""

import hashlib
import time

import msgspec
import numpy as np

from bench.common import machine, write_result

SERIES = 10_000
PER_SERIES = 60
GAPS = 9
ROUNDS = 5
QS = np.array([0.5, 0.9, 0.95, 0.99, 0.999])


class Row(msgspec.Struct):
    count: int
    p50: float
    p90: float
    p95: float
    p99: float
    p999: float


class Snapshot(msgspec.Struct):
    """The fields of a ``tailguard.sli.v1`` snapshot (no stages, no digests)."""

    schema: str
    event_id: str
    ts_ms: int
    series: dict[str, str]
    window: str
    window_s: int
    window_end_ms: int
    final: bool
    count: int
    errors: int
    cancelled: int
    success_rate: float
    ttft_compliance: float
    itl_compliance: float
    slo_compliance: float
    goodput_rps: float
    late: int
    duplicates: int
    exemplars: list[str]
    ttft_ms: Row
    tpot_ms: Row
    itl_ms: Row
    e2e_ms: Row
    stages_ms: dict[str, Row]


def percentiles(values: np.ndarray, groups: int) -> np.ndarray:
    """Each group's percentiles ``QS`` (values ordered by group, equal counts)."""
    rows = values.reshape(groups, -1).copy()
    rows.sort(axis=1)
    last = rows.shape[1] - 1
    pos = QS * last
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, last)
    a, b = rows[:, lo], rows[:, hi]
    return a + (b - a) * (pos - lo)


def close(minute: dict[str, np.ndarray], end_ms: int) -> tuple[list[bytes], np.ndarray]:
    """The payloads of every series' closed minute, and which series' SLOs burn."""
    sid, gap_sid = minute["series"], minute["gap_series"]
    rows = {m: percentiles(minute[m], SERIES) for m in ("ttft", "tpot", "e2e")}
    rows["itl"] = percentiles(minute["itl"], SERIES)
    requests = np.bincount(sid, minlength=SERIES)
    errors = np.bincount(sid, weights=~minute["ok"], minlength=SERIES).astype(np.int64)
    ttft_good = np.bincount(sid, weights=minute["ttft"] <= 800.0, minlength=SERIES)
    e2e_good = np.bincount(sid, weights=minute["e2e"] <= 5_000.0, minlength=SERIES)
    itl_good = np.bincount(gap_sid, weights=minute["itl"] <= 120.0, minlength=SERIES)
    # Four SLOs, the paging rule's 14.4× over 1 − 0.999, gated at 100 requests.
    bad = np.stack([requests - ttft_good, errors, requests - e2e_good, GAPS * requests - itl_good])
    total = np.stack([requests, requests, requests, GAPS * requests])
    burning = ((bad / np.maximum(total, 1) / 0.001) > 14.4) & (requests >= 100)
    ttft_c = ttft_good / np.maximum(requests, 1)
    itl_c = itl_good / np.maximum(GAPS * requests, 1)
    listed = {m: r.tolist() for m, r in rows.items()}
    n, e, tc, ic = requests.tolist(), errors.tolist(), ttft_c.tolist(), itl_c.tolist()
    encode = msgspec.json.Encoder().encode
    out = []
    for s in range(SERIES):
        r = {m: Row(n[s] * (GAPS if m == "itl" else 1), *listed[m][s]) for m in listed}
        names = {"service": f"svc{s % 10}", "model": "m", "variant": "control", "tenant": f"t{s}"}
        for window, seconds in (("1m", 60), ("5m", 300), ("1h", 3600)):
            ident = f"svc{s % 10}|m|control|t{s}|{window}|{end_ms}|final"
            snapshot = Snapshot(
                "tailguard.sli.v1",
                hashlib.blake2b(ident.encode(), digest_size=16).hexdigest(),
                end_ms,
                names,
                window,
                seconds,
                end_ms,
                True,
                n[s],
                e[s],
                0,
                1 - e[s] / n[s],
                tc[s],
                ic[s],
                0.7 * tc[s] + 0.3 * ic[s],
                (n[s] - e[s]) / seconds,
                0,
                0,
                [],
                r["ttft"],
                r["tpot"],
                r["itl"],
                r["e2e"],
                {},
            )
            out.append(encode(snapshot))
    return out, burning


def main() -> None:
    rng = np.random.default_rng(1)
    n = SERIES * PER_SERIES
    series = np.repeat(np.arange(SERIES), PER_SERIES)
    ttft = rng.gamma(2, 50, n)
    minute = {
        "series": series,
        "gap_series": np.repeat(series, GAPS),
        "ttft": ttft,
        "tpot": rng.gamma(2, 10, n),
        "e2e": ttft + rng.gamma(3, 300, n),
        "itl": rng.gamma(2, 15, n * GAPS),
        "ok": rng.random(n) > 0.01,
    }
    rounds = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        payloads, _ = close(minute, 1_700_000_040_000)
        rounds.append(time.perf_counter() - started)
    # The arithmetic is numpy's: check a sample of series against np.percentile.
    rows = percentiles(minute["itl"], SERIES)
    for s in rng.choice(SERIES, 20, replace=False).tolist():
        mine = minute["itl"][s * PER_SERIES * GAPS : (s + 1) * PER_SERIES * GAPS]
        assert np.array_equal(rows[s], np.percentile(mine, QS * 100)), s
    result = {
        "series": SERIES,
        "requests_per_series": PER_SERIES,
        "snapshots": len(payloads),
        "bytes_per_snapshot": round(sum(map(len, payloads)) / len(payloads)),
        "close_s": round(min(rounds), 3),
        "rounds_s": [round(r, 3) for r in rounds],
        "us_per_series": round(min(rounds) / SERIES * 1e6, 1),
        "machine": machine("in-process design probe, no Kafka, not the product's close"),
        "command": "python -m bench.close_columnar",
    }
    write_result("close_columnar", result)
    print(result, flush=True)


if __name__ == "__main__":
    main()
