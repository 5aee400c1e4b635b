"""What every benchmark shares: the machine description, writing results, clean stops."""

import json
import os
import platform
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: The worker's counters line (``TAILGUARD_STATS_INTERVAL_S`` sets how often it is logged).
_STATS = re.compile(rb"applied=(\d+) late=(\d+)")


def machine(note: str) -> dict[str, Any]:
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "note": note}


def write_result(name: str, result: dict[str, Any]) -> None:
    """``bench/results/<name>.json``."""
    (REPO / "bench" / "results" / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")


def _tail(log_path: Path, size: int = 65536) -> bytes:
    """The last ``size`` bytes of a log (read often, while the log grows: not all of it)."""
    with log_path.open("rb") as f:
        f.seek(max(f.seek(0, os.SEEK_END) - size, 0))
        return f.read()


def worker_counters(log_path: Path) -> tuple[int, int]:
    """(applied, late) from a worker's last counters line."""
    found = _STATS.findall(_tail(log_path))  # other lines may come between
    return (int(found[-1][0]), int(found[-1][1])) if found else (0, 0)


_PATHS = re.compile(rb"local=(\d+) forwarded=(\d+)")
_CLOSE = re.compile(rb"close_s=([\d.]+)")


def worker_paths(log_path: Path) -> tuple[int, int]:
    """(local, forwarded) valid events from a worker's last counters line: folded on
    the partition they came in on, and forwarded through the internal topic."""
    found = _PATHS.findall(_tail(log_path))
    return (int(found[-1][0]), int(found[-1][1])) if found else (0, 0)


def worker_close_s(log_path: Path) -> float:
    """Seconds the worker spent closing minutes, from its last counters line."""
    found = _CLOSE.findall(_tail(log_path))
    return float(found[-1]) if found else 0.0


_CHECKPOINTS = re.compile(rb"checkpoints=(\d+) checkpoint_s=([\d.]+)")


def worker_checkpoints(log_path: Path) -> tuple[int, float]:
    """(checkpoints, seconds spent in them) from a worker's last counters line."""
    found = _CHECKPOINTS.findall(_tail(log_path))
    return (int(found[-1][0]), float(found[-1][1])) if found else (0, 0.0)


_STAGES = re.compile(
    rb"checkpoint_s=([\d.]+) close_s=([\d.]+) gc_s=([\d.]+) .*?"
    rb"decode_s=([\d.]+) dispatch_s=([\d.]+) fold_s=([\d.]+)"
)


def worker_stages(log_path: Path) -> dict[str, float]:
    """Seconds the worker's ingest spent per stage, from its last counters line:
    decoding, dispatching (forwarding, A/B, prompts, capacity), folding (closes
    included), and of those or beside them closing minutes, checkpointing and
    collecting garbage."""
    found = _STAGES.findall(_tail(log_path))
    if not found:
        return {}
    checkpoint, close, gc, decode, dispatch, fold = (float(v) for v in found[-1])
    return {
        "decode": decode,
        "dispatch": dispatch,
        "fold": fold,
        "close_within_fold": close,
        "checkpoint": checkpoint,
        "gc": gc,
    }


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` (every thread), 0 for one that is gone."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    return total / os.sysconf("SC_CLK_TCK")


def broker_pids() -> list[int]:
    """The local Kafka broker's JVM, found by its main class (empty when none runs here)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"kafka.Kafka\x00" in cmdline or cmdline.endswith(b"kafka.Kafka"):
            found.append(int(entry.name))
    return found


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # runs the finally blocks: no orphan worker


def run(main: Callable[[], None]) -> None:
    """Run a benchmark's ``main`` so that SIGTERM (``timeout``) still stops its worker."""
    signal.signal(signal.SIGTERM, _exit_on_term)
    main()
