"""What closing one minute of 10,000 series costs, in process.

    python -m bench.close                 (make bench runs it too)

The throughput benchmark's ``close_minute_s`` is this close plus whatever the
broker and the machine do meanwhile; here it is alone. The benchmark's
messages (10,000 series, 60 requests each) are folded into their windows,
recording every minute that closes; then each close is replayed through the
worker's own close (:meth:`~tailguard.agents.folder.SeriesFolder` ``_closer``:
the windows merged, their final snapshots summarised and framed, every SLO of
the series and the silent detector evaluated, breach events framed), without
a broker: what would be published is counted, not sent; the fastest of
``ROUNDS`` replays counts. Writes
``bench/results/close.json``: the whole close, and per series. The data path
needs the close of a minute of 10,000 series within 1 s.
"""

import gc
import json
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
from tailguard.agents.breaches import BreachEngine
from tailguard.agents.control import SloBook
from tailguard.agents.folder import SeriesFolder
from tailguard.agents.internal import group_by_partition, series_index, series_key
from tailguard.agents.pipeline import default_slos
from tailguard.agents.settings import Settings
from tailguard.agents.state import CachedSeries
from tailguard.agents.stats import WorkerStats
from tailguard.schemas import Limits, decode
from tailguard.streams import RingConfig, SeriesWindows
from tailguard.streams.fold import fold_many

from bench.common import machine, write_result
from bench.throughput import make_placed_messages

SERIES = 10_000
EVENTS = 600_000
BATCH = 500
#: The same closes replayed this many times; the fastest counts (this shared
#: machine drifts by a factor of two from one second to the next).
ROUNDS = 3


def _topic(name: str) -> Any:
    return SimpleNamespace(get_topic_name=lambda: name)


def fold_and_record(
    states: dict[tuple[str, str, str, str], SeriesWindows],
) -> list[tuple[tuple[str, str, str, str], int]]:
    """Fold the benchmark's events; every (series, minute end) that closed, in order."""
    msgs = make_placed_messages(EVENTS, SERIES)
    now = int(time.time() * 1000)
    closes: list[tuple[tuple[str, str, str, str], int]] = []
    for lo in range(0, len(msgs), BATCH):
        valid, positions = [], []
        for j, (part, raw) in enumerate(msgs[lo : lo + BATCH]):
            decoded = decode(raw, "inference", now_ms=now, limits=Limits())
            valid.extend(decoded.valid)
            positions.extend([(part, lo + j)] * len(decoded.valid))
        index = series_index(valid)
        for groups in group_by_partition(valid, positions, index, np.arange(len(valid))).values():
            names = groups.series
            series = [states.setdefault(s, SeriesWindows(RingConfig())) for s in names]
            closers = [lambda end, s=s: closes.append((s, end)) for s in names]
            fold_many(series, groups.cols, groups.bounds, closers)
    return closes


def main() -> None:
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    states: dict[tuple[str, str, str, str], SeriesWindows] = {}
    closes = fold_and_record(states)
    settings = Settings()
    book = SloBook(default_slos())
    engine = BreachEngine(slos=book.specs, state_table={}, gpu_table=None)
    topics: Any = SimpleNamespace(
        sli=_topic("sli"), breaches=_topic("breaches"), interference=_topic("interference")
    )
    folder = SeriesFolder(None, topics, settings, WorkerStats(), None, engine, None)  # type: ignore[arg-type]
    specs = {s: engine.specs_for(s) for s, _ in closes}
    rounds = []
    for _ in range(ROUNDS):
        closing: list[Any] = []
        outgoing: list[Any] = []
        gc.disable()  # as the ingest agent folds (and closes) a batch
        started = time.perf_counter()
        for series, end in closes:
            key = series_key(*series)
            cached = CachedSeries(states[series], 0)
            folder._closer(series, key, cached, specs[series], closing, outgoing)(end)
        outgoing.extend(folder.snapshots(closing, final=True))
        rounds.append(time.perf_counter() - started)
        gc.enable()
    seconds = min(rounds)
    n_series = len({s for s, _ in closes})
    result = {
        "series": n_series,
        "closes": len(closes),
        "slos_per_series": round(sum(len(v) for v in specs.values()) / max(1, len(specs)), 2),
        "windows": list(settings.sli_windows),
        "close_s": round(seconds, 3),
        "rounds_s": [round(r, 3) for r in rounds],
        "us_per_close": round(seconds / len(closes) * 1e6, 1),
        "published": {
            "snapshots": sum(1 for topic, *_ in outgoing if topic == "sli"),
            "breach_events": sum(1 for topic, *_ in outgoing if topic == "breaches"),
        },
        "machine": machine("in-process, no Kafka"),
        "command": "python -m bench.close",
    }
    write_result("close", result)
    print(json.dumps(result, indent=2), flush=True)


if __name__ == "__main__":
    main()
