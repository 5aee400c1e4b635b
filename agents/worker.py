"""Run a worker process, with crash-safe local state.

faust writes a table value to the local RocksDB at once and to its changelog
topic a moment later, so after a SIGKILL the local store can hold writes the
changelog never received — a state no other worker could reproduce. tailguard
therefore trusts local state only after a clean stop: the worker drops a
``CLEAN`` marker when it stops normally and removes it when it starts; a start
without the marker discards the local stores and restores them from the
changelog, which (with per-bucket input offsets, :mod:`tailguard.streams.ring`)
converges to the uninterrupted result.
"""

import contextlib
import ctypes
import gc
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import faust
from tailguard.agents.pipeline import build
from tailguard.agents.settings import Settings
from tailguard.agents.stats import time_gc

__all__ = ["ProducerBackpressureSummary", "limit_malloc_arenas", "prepare_data_dir", "run_worker"]

CLEAN_MARKER = "CLEAN"
log = logging.getLogger("tailguard.worker")


def prepare_data_dir(data_dir: Path) -> bool:
    """Ready ``data_dir`` for a start; returns ``True`` when local state was discarded."""
    marker = data_dir / CLEAN_MARKER
    discarded = False
    if data_dir.exists() and any(data_dir.iterdir()) and not marker.exists():
        shutil.rmtree(data_dir)
        discarded = True
    data_dir.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    return discarded


#: glibc's mallopt parameter for the number of heap arenas.
_M_ARENA_MAX = -8


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's heap arenas (as ``MALLOC_ARENA_MAX`` would), unless the environment sets it.

    glibc gives threads that allocate at the same time their own arenas (up to
    8 per core); librdkafka, RocksDB and faust's threads then keep freed memory
    in arenas the Python thread never reuses. Two arenas cut the worker's peak
    RSS by ~140 MiB in ``bench.throughput`` (docs/performance.md, Memory). Returns whether
    the cap was applied (False off glibc or when the environment decides).
    """
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_ARENA_MAX, arenas))
    except (OSError, AttributeError):  # not glibc
        return False


class ProducerBackpressureSummary(logging.Filter):
    """faust's two lines per changelog back-pressure wait, as one summary a minute.

    A table write queues a changelog record; when more than 100 are queued, faust
    makes the stream wait until they are sent and logs ``producer buffer full
    size N`` (WARNING) and ``producer flush took S`` (INFO) each time. Under
    load that is normal and frequent — 1,580 pairs in a 4-minute burst
    benchmark — and it buried the worker's own lines. This filter (on faust's
    ``faust.transport.producer`` logger) keeps the first wait's WARNING and then
    one every ``every_s`` at most, rewritten to say how many waits there were and
    how long they took together; the rest, and every INFO ``flush took`` line,
    are dropped (a stalled producer still shows: its waits keep coming, and are
    reported each ``every_s``).
    """

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        self.waits = 0
        self.wait_s = 0.0
        self.since: float | None = None
        self.last: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if msg.startswith("producer flush took"):
            with contextlib.suppress(ValueError):
                self.wait_s += float(msg.rsplit(" ", 1)[1])
            return False
        if not msg.startswith("producer buffer full size"):
            return True
        self.waits += 1
        now = self.clock()
        if self.since is None:
            self.since = now
        if self.last is not None and now - self.last < self.every_s:
            return False
        record.msg = (
            "tailguard: table writes waited for faust's changelog producer %d time(s) in "
            "the last %.0f s, %.2f s in all (%s; back-pressure: normal in bursts, a "
            "stalled producer if it persists)"
        )
        record.args = (self.waits, now - self.since, self.wait_s, msg)
        self.waits, self.wait_s, self.since, self.last = 0, 0.0, now, now
        return True


def run_worker(settings: Settings, loglevel: str = "info") -> int:
    """Run until SIGINT/SIGTERM; returns the exit code."""
    limit_malloc_arenas()
    discarded = prepare_data_dir(settings.data_dir)
    pipeline = build(settings)
    # The worker allocates millions of short-lived objects per second (decoded
    # events) beside a large, long-lived heap (window state): with the default
    # thresholds the cyclic GC rescans that heap constantly. Objects built at
    # start-up are frozen out of it, and young collections run less often.
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    time_gc(pipeline.stats)
    worker = faust.Worker(pipeline.app, loglevel=loglevel, quiet=True)
    logging.getLogger("faust.transport.producer").addFilter(ProducerBackpressureSummary())
    if discarded:
        worker.log.warning(
            "previous run did not stop cleanly: local state in %s discarded, "
            "restoring from the changelog",
            settings.data_dir,
        )
    code = 1
    pipeline.gpu_cache.start()
    if pipeline.admin is not None:
        pipeline.admin.start()  # reads the control topic to its end first
    if pipeline.prompts is not None:
        pipeline.prompts.start()  # reads the prompt registry to its end first
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        pipeline.gpu_cache.stop()
        if pipeline.admin is not None:
            pipeline.admin.stop()
        if pipeline.prompts is not None:
            pipeline.prompts.stop()
    if code == 0:
        (settings.data_dir / CLEAN_MARKER).touch()
    return code
