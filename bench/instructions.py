"""Instructions an event costs on the hot path, counted by callgrind: a figure this
shared machine's drift does not move.

    python -m bench.instructions          (make bench-instructions; needs valgrind)

Timings on a shared 2-core machine drift by ±15 % within the hour, more than
most single changes to the hot path are worth; the number of instructions a
fixed workload executes does not drift (same Python, numpy and msgspec). So
this benchmark counts them: ``bench.hotpath``'s stages — decode, grouping by
partition and series, ``fold_many`` through one ledger, and the checkpoint's
bytes (``take_changes``, every other batch) — over ``BATCHES`` batches of the
benchmark's messages (100,000 events of 10,000 series a batch), run under
``valgrind --tool=callgrind``; then the same process loading the same
messages and doing nothing else, and the difference per event is the figure.
Writes ``bench/results/instructions.json``.

To compare two commits, run it on each: the counts of one commit repeat to
within about 0.1 % (53,735 and 53,787 an event, two runs of one commit).

It counts the minute's close the same way (``close_instructions_per_series``):
``CLOSE_SERIES`` series folded through a minute as ``bench.close`` folds them,
on a fixed clock, then every minute that closed closed by the worker's own
close (:meth:`~tailguard.agents.folder.SeriesFolder.close_all`: final
snapshots, SLOs, the silent detector), less the same process folding alone.
``closing_batch_instructions_per_series`` counts the whole batch that closes
the minute the same way (decoding, grouping, the fold, the closes, the
roll-ups after), the ledger settled before it as the worker settles it when
the input pauses (:func:`bench.close.closing_batch`).
``python -m bench.instructions --close-only`` counts the close and the closing batch (~8 min),
``--hot-only`` the hot path alone (~5 min); neither writes the results file.
"""

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench.common import REPO, machine, write_result

BATCHES = 3
BATCH = 500  # input messages per ingest batch, as the worker takes them
#: Series whose minute the close count closes (60 requests each).
CLOSE_SERIES = 1_000
#: Event time of the workload: fixed, so every run folds the same minutes.
NOW_MS = 1_800_000_000_000


def _stages(messages_path: str, only_load: bool) -> None:
    """The measured process: load the messages, then (unless ``only_load``) run the stages."""
    import gc

    import numpy as np
    from tailguard.agents.ingest import gc_paused
    from tailguard.agents.internal import columns_by_partition
    from tailguard.agents.requests import RequestBatch
    from tailguard.schemas import Limits
    from tailguard.schemas.columnar import decode_columns
    from tailguard.streams import RingConfig, SeriesWindows
    from tailguard.streams.fold import fold_many
    from tailguard.streams.fold_batch import Ledger

    with open(messages_path, "rb") as f:
        messages = pickle.load(f)
    if only_load:
        return
    limits, ring, ledger = Limits(), RingConfig(), Ledger()
    states: dict[tuple[str, str, str, str], SeriesWindows] = {}
    gc.freeze()
    for round_ in range(BATCHES):
        with gc_paused():  # as the ingest agent takes a batch
            batch = RequestBatch()
            for j, (part, raw) in enumerate(messages[round_ * BATCH : (round_ + 1) * BATCH]):
                decoded = decode_columns(raw, now_ms=NOW_MS, limits=limits)
                batch.add_columns(part, round_ * BATCH + j, decoded)
            groups = columns_by_partition(
                batch.columns(), batch.gid, batch.series, batch.served(), np.arange(len(batch))
            )
            for group in groups.values():
                folded = [
                    states.get(s) or states.setdefault(s, SeriesWindows(ring)) for s in group.series
                ]
                fold_many(folded, group.cols, group.bounds, ledger=ledger)
            if round_ % 2 == 0:
                for state in states.values():
                    state.take_changes()


def _close(only_fold: bool) -> None:
    """The measured process of the close count: fold, then (unless ``only_fold``) close."""
    import gc

    from tailguard.agents.internal import series_key
    from tailguard.agents.state import CachedSeries

    from bench import close

    gc.freeze()
    gc.disable()  # as the ingest agent folds and closes a batch
    states: dict[tuple[str, str, str, str], Any] = {}
    closes = close.fold_and_record(states, CLOSE_SERIES * 60, CLOSE_SERIES, NOW_MS)
    if only_fold:
        return
    folder, engine = close._folder()
    folder.outputs = _Sent()
    pending = [
        (s, series_key(*s), CachedSeries(states[s], 0), engine.specs_for(s), end)
        for s, end in closes
    ]
    folder.close_all(pending)


class _Sent:
    """Outputs that only count what would be sent."""

    def __init__(self) -> None:
        self.sent = 0

    def send(self, topic: str, key: bytes, value: bytes, headers: Any = None) -> None:
        self.sent += 1


#: The packages a counted process imports from this checkout.
_SOURCES = ("streams", "agents", "schemas", "tailguard", "bench")


def _compile_sources() -> None:
    """Write the bytecode of every module first: a counted process that found a
    module changed since its last import compiled it, and counted the compiler
    (some 16,000 instructions a close, in one count of the close after one
    module of it had changed)."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *(str(REPO / d) for d in _SOURCES)],
        check=True,
        capture_output=True,
    )


def _instructions(args: list[str]) -> int:
    """Instructions ``python -m bench.instructions *args`` executes, under callgrind."""
    with tempfile.TemporaryDirectory(prefix="tg-callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-m",
                "bench.instructions",
                *args,
            ],
            check=True,
            cwd=REPO,
            capture_output=True,
            # The same string hashes and one BLAS thread every run: counts that repeat.
            env={**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"},
        )
        for line in out.read_text().splitlines():
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    msg = "callgrind wrote no instruction total"
    raise RuntimeError(msg)


def _closing(only_fold: bool) -> None:
    """The measured process of the closing batch: ``CLOSE_SERIES`` series' minute
    folded, the ledger settled as at an idle moment, then (unless ``only_fold``)
    the batch that closes the minute, as the worker takes it (:func:`close.closing_batch`)."""
    import gc

    from bench import close

    gc.freeze()
    close.closing_batch(
        CLOSE_SERIES * 60, CLOSE_SERIES, NOW_MS, idle_settle=True, close=not only_fold
    )


def _closing_count() -> dict[str, Any]:
    total = _instructions(["--closing"])
    base = _instructions(["--closing", "--only-fold"])
    return {"closing_batch_instructions_per_series": round((total - base) / CLOSE_SERIES)}


def _close_count() -> dict[str, Any]:
    total = _instructions(["--close"])
    base = _instructions(["--close", "--only-fold"])
    return {
        "close_series": CLOSE_SERIES,
        "close_instructions": total - base,
        "close_instructions_per_series": round((total - base) / CLOSE_SERIES),
    }


def main(close_only: bool, hot_only: bool = False) -> None:
    if shutil.which("valgrind") is None:
        print("bench.instructions: valgrind not found; install it (apt install valgrind)")
        raise SystemExit(2)
    from bench.workload import make_placed_messages

    _compile_sources()
    events = BATCHES * BATCH * 200
    started = time.time()
    result: dict[str, Any] = {}
    if not close_only:
        messages = make_placed_messages(events, 10_000, encoding="columns")[: BATCHES * BATCH]
        with tempfile.TemporaryDirectory(prefix="tg-instructions-") as tmp:
            path = os.path.join(tmp, "messages.pickle")
            with open(path, "wb") as f:
                pickle.dump(messages, f)
            total = _instructions(["--stages", path])
            base = _instructions(["--stages", path, "--only-load"])
        result = {
            "events": events,
            "series": 10_000,
            "batches": BATCHES,
            "stages": "decode, grouping, fold_many, checkpoint bytes (every other batch)",
            "instructions": total - base,
            "instructions_per_event": round((total - base) / events),
        }
    if not hot_only:
        result |= _close_count() | _closing_count()
    result |= {
        "versions": {name: version(name) for name in ("numpy", "msgspec", "fastdigest")},
        "minutes_to_count": round((time.time() - started) / 60, 1),
        "machine": machine("callgrind: instructions, not time"),
        "command": "python -m bench.instructions"
        + (" --close-only" if close_only else "")
        + (" --hot-only" if hot_only else ""),
    }
    if not close_only and not hot_only:
        write_result("instructions", result)
    print(json.dumps(result, indent=2), flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--stages":
        _stages(sys.argv[2], only_load="--only-load" in sys.argv)
    elif len(sys.argv) >= 2 and sys.argv[1] == "--close":
        _close(only_fold="--only-fold" in sys.argv)
    elif len(sys.argv) >= 2 and sys.argv[1] == "--closing":
        _closing(only_fold="--only-fold" in sys.argv)
    else:
        main(close_only="--close-only" in sys.argv, hot_only="--hot-only" in sys.argv)
