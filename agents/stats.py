"""In-process counters of a worker (exported to Prometheus by the operators' issue)."""

import gc
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["WorkerStats", "time_gc"]


@dataclass(slots=True)
class WorkerStats:
    """What one worker has processed since it started."""

    messages: int = 0
    #: Ingest batches taken (``valid / batches``: the requests a fold takes at once).
    batches: int = 0
    #: Input messages in the columnar form (the others are rows: JSON objects).
    messages_columnar: int = 0
    events_valid: int = 0
    #: Valid events folded on the partition they came in on (one broker hop).
    events_local: int = 0
    #: Valid events forwarded to their series' partition through the internal topic.
    events_forwarded: int = 0
    events_applied: int = 0
    late: int = 0
    duplicates: int = 0
    replayed: int = 0
    snapshots: int = 0
    gpu_samples: int = 0
    breach_events: int = 0
    checkpoints: int = 0
    state_writes: int = 0
    #: Wall time the SLI agent spent checkpointing (its share paces the checkpoints).
    checkpoint_seconds: float = 0.0
    #: Wall time spent closing minutes: final snapshots, SLO and silent evaluations.
    close_seconds: float = 0.0
    #: Time the cyclic garbage collector ran, every thread (see :func:`time_gc`).
    gc_seconds: float = 0.0
    #: Wall time the ingest agent spent on its batches, by stage: decoding and
    #: validating the messages; forwarding and feeding the side consumers
    #: (A/B, prompts, capacity); folding (closes included, checkpoints not).
    decode_seconds: float = 0.0
    dispatch_seconds: float = 0.0
    fold_seconds: float = 0.0
    #: Requests whose deployment's capacity state the ingest applied itself (its
    #: partition is here), and requests it forwarded to the partition's owner.
    capacity_in_place: int = 0
    capacity_forwarded: int = 0
    internal_errors: int = 0
    redelivered: int = 0
    deadletters: Counter[str] = field(default_factory=Counter)

    def line(self) -> str:
        """One log line."""
        dl = sum(self.deadletters.values())
        return (
            f"messages={self.messages} batches={self.batches} columnar={self.messages_columnar} "
            f"valid={self.events_valid} applied={self.events_applied} "
            f"late={self.late} duplicates={self.duplicates} replayed={self.replayed} "
            f"deadletters={dl} snapshots={self.snapshots} checkpoints={self.checkpoints} "
            f"checkpoint_s={self.checkpoint_seconds:.1f} close_s={self.close_seconds:.2f} "
            f"gc_s={self.gc_seconds:.2f} "
            f"state_writes={self.state_writes} redelivered={self.redelivered} "
            f"local={self.events_local} forwarded={self.events_forwarded} "
            f"decode_s={self.decode_seconds:.2f} dispatch_s={self.dispatch_seconds:.2f} "
            f"fold_s={self.fold_seconds:.2f} "
            f"cap_in_place={self.capacity_in_place} cap_forwarded={self.capacity_forwarded}"
        )


def time_gc(stats: WorkerStats) -> None:
    """Add the time every collection of the cyclic garbage collector takes to
    ``stats.gc_seconds`` (a callback around each; collections hold the GIL)."""
    started = [0.0]

    def clock(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            stats.gc_seconds += time.perf_counter() - started[0]

    gc.callbacks.append(clock)
