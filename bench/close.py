"""What closing one minute of 10,000 series costs, in process.

    python -m bench.close                 (make bench runs it too)

The throughput benchmark's ``close_minute_s`` is this close plus whatever the
broker and the machine do meanwhile; here it is alone. The benchmark's
messages (10,000 series, 60 requests each) are folded into their windows,
recording every minute that closes; then each close is replayed through the
worker's own close (:meth:`~tailguard.agents.folder.SeriesFolder.close_all`,
all of them in one pass: the windows merged, their final snapshots summarised
and framed, every SLO of the series and the silent detector evaluated, breach
events framed), without a broker: what would be published is counted, not
sent; the fastest of
``ROUNDS`` replays counts. Writes
``bench/results/close.json``: the whole close, and per series. The data path
needs the close of a minute of 10,000 series within 1 s.

``closing_batch_s`` is closer to what the throughput benchmark times: the whole
batch of closing requests as the worker takes it (decoded, grouped, folded,
its closes, the roll-ups after), after the benchmark's requests were folded
the worker's way (through one ledger, put into the buckets at the next read).
What it costs beyond ``closing_batch_closes_s`` is what a close costs the fold.
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
from tailguard.agents.interference_wire import PointsMsg, decode_internal
from tailguard.agents.internal import (
    columns_by_partition,
    group_by_partition,
    series_index,
    series_key,
)
from tailguard.agents.pipeline import default_slos
from tailguard.agents.requests import RequestBatch
from tailguard.agents.settings import Settings
from tailguard.agents.state import CachedSeries
from tailguard.agents.stats import WorkerStats
from tailguard.schemas import InferenceEvent, Limits, decode
from tailguard.schemas.columnar import decode_columns
from tailguard.streams import RingConfig, SeriesWindows
from tailguard.streams.fold import fold_many, tidy_after
from tailguard.streams.fold_batch import Ledger

from bench.common import machine, write_result
from bench.workload import make_placed_messages, make_placed_workload

SERIES = 10_000
EVENTS = 600_000
BATCH = 500
#: The same closes replayed this many times; the fastest counts (this shared
#: machine drifts by a factor of two from one second to the next).
ROUNDS = 3
#: Steady state: series with this many minutes of history (three days and an hour).
STEADY_MINUTES = 3 * 24 * 60 + 60
STEADY_SERIES = 500


def _topic(name: str) -> Any:
    return SimpleNamespace(get_topic_name=lambda: name)


def fold_and_record(
    states: dict[tuple[str, str, str, str], SeriesWindows],
    events: int = EVENTS,
    n_series: int = SERIES,
    now_ms: int | None = None,
) -> list[tuple[tuple[str, str, str, str], int]]:
    """Fold ``events`` of ``n_series`` series (placed before ``now_ms``, None:
    now); every (series, minute end) that closed, in order.

    The rings hold their roll-ups and pruning, as the worker's do until it has
    closed what a fold closed (:func:`tidy_after`): a close then reads what the
    worker's reads, whichever minute of the hour it is (an hour rolled up
    before the close would be read as a window of its own)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    msgs = make_placed_messages(events, n_series, now_ms=now)
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
            series = [states.get(s) or _new_ring(states, s) for s in names]
            closers = [lambda end, s=s: closes.append((s, end)) for s in names]
            fold_many(series, groups.cols, groups.bounds, closers)
    return closes


def _new_ring(states: dict[Any, SeriesWindows], series: Any) -> SeriesWindows:
    state = states[series] = SeriesWindows(RingConfig())
    state.tidy_held = True  # until the close has read it (see fold_and_record)
    return state


def _request(event_id: str, ts_ms: int) -> InferenceEvent:
    """A healthy request, as the steady-state history holds."""
    return InferenceEvent(
        event_id=event_id,
        ts_ms=ts_ms,
        service="svc",
        model="m",
        status="ok",
        e2e_ms=900.0,
        ttft_ms=200.0,
        output_tokens=11,
    )


class _Counted:
    """Outputs that count what would be sent, per topic, and the closed minutes
    the interference records carry."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        self.points = 0

    def send(self, topic: str, key: bytes, value: bytes, headers: Any = None) -> None:
        self.sent[topic] = self.sent.get(topic, 0) + 1
        if topic == "interference":
            msg = decode_internal(value)
            self.points += len(msg.points) if isinstance(msg, PointsMsg) else 0


def _folder() -> tuple[SeriesFolder, BreachEngine]:
    settings = Settings()
    engine = BreachEngine(slos=SloBook(default_slos()).specs, state_table={}, gpu_table=None)
    topics: Any = SimpleNamespace(
        sli=_topic("sli"), breaches=_topic("breaches"), interference=_topic("interference")
    )
    outputs: Any = _Counted()
    folder = SeriesFolder(None, topics, settings, WorkerStats(), None, engine, outputs)  # type: ignore[arg-type]
    return folder, engine


def replay_closes(
    closes: list[tuple[tuple[str, str, str, str], int]],
    states: dict[tuple[str, str, str, str], SeriesWindows],
) -> tuple[list[float], dict[str, int], int]:
    """Every close through the worker's own close, ``ROUNDS`` times: seconds per
    round, the records the last round would have published per topic, and its
    interference points."""
    specs: dict[Any, list[Any]] = {}
    rounds = []
    sent: dict[str, int] = {}
    points = 0
    for _ in range(ROUNDS):
        folder, engine = _folder()
        for series, _ in closes:
            specs.setdefault(series, engine.specs_for(series))
        pending = [
            (series, series_key(*series), CachedSeries(states[series], 0), specs[series], end)
            for series, end in closes
        ]
        gc.disable()  # as the ingest agent folds (and closes) a batch
        started = time.perf_counter()
        folder.close_all(pending)
        rounds.append(time.perf_counter() - started)
        gc.enable()
        sent, points = folder.outputs.sent, folder.outputs.points
        for state in states.values():
            state.release_window_cache()
    return rounds, sent, points


def steady_states(n_series: int) -> tuple[list[Any], dict[Any, SeriesWindows]]:
    """``n_series`` series with three days and an hour of history (ten requests a
    minute): what a close reads once a worker has run for days. One series is
    folded, the others restored from its stored state (each its own objects)."""
    base = int(time.time() * 1000) // 3_600_000 * 3_600_000 - STEADY_MINUTES * 60_000
    template = SeriesWindows(RingConfig())
    ends: list[int] = []
    n = 0
    for m in range(STEADY_MINUTES):
        template.add(
            [_request(f"s{n + i}", base + m * 60_000 + i * 6_000) for i in range(10)],
            on_close=ends.append,
        )
        n += 10
    changes = template.take_changes()
    states = {
        (f"svc{i % 10}", f"m{i // 10}", "default", "default"): SeriesWindows.restore(
            changes.meta, changes.upserts.get
        )
        for i in range(n_series)
    }
    # The last closed minute that is also a 5-minute boundary: 1m, 5m and 1h final.
    end = max(e for e in ends if e % 300_000 == 0)
    return [(s, end) for s in states], states


def closing_batch(
    events: int = EVENTS,
    n_series: int = SERIES,
    now_ms: int | None = None,
    *,
    idle_settle: bool = False,
    close: bool = True,
) -> tuple[float, float]:
    """The batch that closes the minute, as the worker takes it: the benchmark's
    requests folded through one ledger (as the worker folds them, each batch put
    into the buckets at the next read), then its closing requests (one a series,
    in the next minute) decoded, grouped and folded, every minute that closes
    closed (:meth:`SeriesFolder.close_all`) and the windows rolled up after.
    Seconds for the whole batch, and for the closes within it: the rest is what
    closing costs the fold (each series' watermark moved, what the ledger owes
    put in, the roll-ups), which ``close_s`` does not show.

    ``idle_settle``: the ledger is settled before the closing batch, as the worker
    settles it when the input pauses; ``close``: False stops before the closing
    batch (what :mod:`bench.instructions` subtracts)."""
    msgs, closing = make_placed_workload(events, n_series, encoding="columns", now_ms=now_ms)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    limits = Limits()
    states: dict[tuple[str, str, str, str], SeriesWindows] = {}
    ledger = Ledger()
    folder, engine = _folder()
    specs: dict[tuple[str, str, str, str], list[Any]] = {}
    closes_s = 0.0

    def take(batch: list[tuple[int | None, bytes]], first_offset: int) -> None:
        nonlocal closes_s
        requests = RequestBatch()
        for j, (part, raw) in enumerate(batch):
            decoded = decode_columns(raw, now_ms=now, limits=limits)
            requests.add_columns(part or 0, first_offset + j, decoded)
        cols, gid, series = requests.columns(), requests.gid, requests.series
        groups = columns_by_partition(cols, gid, series, requests.served(), np.arange(len(gid)))
        for partition, group in groups.items():
            closes: list[Any] = []
            folded, closers = [], []
            for name in group.series:
                state = states.get(name) or states.setdefault(name, SeriesWindows(RingConfig()))
                if name not in specs:
                    specs[name] = engine.specs_for(name)
                cached = CachedSeries(state, partition)
                note = (name, series_key(*name), cached, specs[name])
                folded.append(state)
                closers.append(lambda end, note=note, to=closes: to.append((*note, end)))
            with tidy_after(folded):
                fold_many(folded, group.cols, group.bounds, closers, ledger)
                started = time.perf_counter()
                folder.close_all(closes)
                closes_s += time.perf_counter() - started

    gc.disable()  # as the ingest agent takes a batch
    for lo in range(0, len(msgs), BATCH):
        take(msgs[lo : lo + BATCH], lo)
    if idle_settle:
        ledger.settle()
    if not close:
        return 0.0, 0.0
    closes_s = 0.0
    started = time.perf_counter()
    take(closing, len(msgs))
    seconds = time.perf_counter() - started
    gc.enable()
    return seconds, closes_s


def main() -> None:
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    states: dict[tuple[str, str, str, str], SeriesWindows] = {}
    closes = fold_and_record(states)
    rounds, sent, points = replay_closes(closes, states)
    seconds = min(rounds)
    n_series = len({s for s, _ in closes})
    steady_closes, steady = steady_states(STEADY_SERIES)
    steady_rounds, _, _ = replay_closes(steady_closes, steady)
    per_steady = min(steady_rounds) / len(steady_closes)
    _, engine = _folder()
    batch_s, closes_in_batch_s = closing_batch()
    result = {
        "series": n_series,
        "closes": len(closes),
        "slos_per_series": round(
            sum(len(engine.specs_for(s)) for s in {s for s, _ in closes}) / max(1, n_series), 2
        ),
        "windows": list(Settings().sli_windows),
        "close_s": round(seconds, 3),
        "rounds_s": [round(r, 3) for r in rounds],
        "us_per_close": round(seconds / len(closes) * 1e6, 1),
        # The whole batch that closes the minute (one run): decoding and grouping
        # its 10,000 requests, folding them, the closes, the roll-ups after.
        "closing_batch_s": round(batch_s, 3),
        "closing_batch_closes_s": round(closes_in_batch_s, 3),
        "published": {
            "snapshots": sent.get("sli", 0),
            "breach_events": sent.get("breaches", 0),
            "interference_points": points,
            "interference_records": sent.get("interference", 0),
        },
        "steady": {
            "history": "3 days and 1 hour, 10 requests a minute",
            "series": len(steady_closes),
            "us_per_close": round(per_steady * 1e6, 1),
            "close_s_at_10000_series": round(per_steady * 10_000, 2),
        },
        "machine": machine("in-process, no Kafka"),
        "command": "python -m bench.close",
    }
    write_result("close", result)
    print(json.dumps(result, indent=2), flush=True)


if __name__ == "__main__":
    main()
