"""When the SLI agent checkpoints each partition: often, but never most of its time.

A checkpoint writes every series that changed since the last one (its open
bucket and its meta, two changelog records), whatever number of events
changed it. With a few hundred series that is milliseconds; with 10,000 busy
series on one worker it is seconds (measured by ``make bench``: ~3.5 s for
20,000 records), and a fixed 5 s period would then spend most of the agent's
time rewriting state instead of folding events.

So the period stretches with the cost: after a checkpoint, the partition's next
one waits at least ``interval_s``, and at least the owned partitions' latest
checkpoint durations added up, divided by ``max_share`` (each partition's
checkpoint recurs after that gap, so together they take at most ``max_share``
of the agent's time), and never more than ``max_interval_s``, which bounds the
input a crash makes the worker replay and how far the committed offsets lag.
A partition that has not checkpointed for twice that long has gone quiet (a
partition without new input holds nothing to write): its last duration no
longer recurs, so it stops counting.

A duration is wall time, from the start of the writes to the last
acknowledgement, including the waits for the producer to deliver: the agent
holds its lock all along, so for that long it folds nothing (other agents may
run meanwhile, so under load this overstates the CPU spent, and errs towards
longer periods — bounded by ``max_interval_s``).

Pure bookkeeping with the caller's clock: unit-tested without a worker.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["CheckpointCadence"]


@dataclass(slots=True)
class CheckpointCadence:
    """Per-partition checkpoint due times (monotonic seconds)."""

    interval_s: float
    max_share: float = 0.2
    max_interval_s: float = 30.0
    #: When each partition's last checkpoint ended (or the partition was first seen).
    _since: dict[int, float] = field(default_factory=dict)
    #: Duration of each partition's latest checkpoint.
    _took: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Messages name the worker settings these come from (``Settings`` builds
        # a cadence to check them, and passes the message on to the operator).
        if not (self.interval_s > 0 and math.isfinite(self.interval_s)):
            got = self.interval_s
            msg = f"checkpoint_interval_s must be a finite number of seconds > 0, got {got}"
            raise ValueError(msg)
        if not 0 < self.max_share <= 1:
            msg = f"checkpoint_max_share must be in (0, 1], got {self.max_share}"
            raise ValueError(msg)
        if not (self.max_interval_s > 0 and math.isfinite(self.max_interval_s)):
            got = self.max_interval_s
            msg = f"checkpoint_max_interval_s must be a finite number of seconds > 0, got {got}"
            raise ValueError(msg)
        # A maximum under the minimum would be ignored silently; make it the minimum.
        self.max_interval_s = max(self.max_interval_s, self.interval_s)

    def gap(self, now: float) -> float:
        """Seconds from a partition's checkpoint to its next, as things stand at ``now``."""
        quiet = 2 * self.max_interval_s
        recurring = sum(
            took for p, took in self._took.items() if now - self._since.get(p, now) <= quiet
        )
        return min(max(self.interval_s, recurring / self.max_share), self.max_interval_s)

    def due(self, partition: int, now: float) -> bool:
        """Whether ``partition`` should checkpoint now (a new partition starts its clock)."""
        since = self._since.setdefault(partition, now)
        return now - since >= self.gap(now)

    def most_overdue(self, partitions: Iterable[int], now: float) -> int | None:
        """The partition of ``partitions`` due the longest (None: none is due)."""
        due = [p for p in partitions if self.due(p, now)]
        return min(due, key=lambda p: self._since[p]) if due else None

    def done(self, partition: int, started: float, ended: float) -> None:
        """A checkpoint of ``partition`` ran from ``started`` to ``ended``."""
        self._took[partition] = max(ended - started, 0.0)
        self._since[partition] = ended

    def deferred(self, partition: int, now: float) -> None:
        """The checkpoint could not run (outputs undeliverable): try again a gap later."""
        self._since[partition] = now

    def forget(self, partitions: set[int]) -> None:
        """Partitions no longer owned: their durations no longer count."""
        for partition in partitions:
            self._since.pop(partition, None)
            self._took.pop(partition, None)

    def partitions(self) -> set[int]:
        return set(self._since)
