"""A deployment's capacity state in its table: read it, and the writes of a save.

Every read names the table partition the deployment hashes to: the capacity
agent reads in the context of an internal message of that partition, and the
ingest, which applies the requests of its own deployments in place, in the
context of an input event of another partition (faust's ``Table.get`` would
look in that one). Writes are returned, not made: the caller writes them
(:class:`~tailguard.agents.bulk.BulkWriter`) and delivers the changelog before
it acknowledges the input they hold.

The keys, and why a save writes in this order, are in :mod:`tailguard.agents.capacity`.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from tailguard.agents.bulk import read_partition
from tailguard.agents.capacity_apply import Deployment
from tailguard.agents.capacity_columns import partition_of
from tailguard.agents.capacity_tuning import CapacityTuning
from tailguard.streams.capacity_state import (
    decode_core,
    decode_experts,
    decode_knee,
    decode_rag,
    encode_core,
    encode_experts,
    encode_knee,
    encode_rag,
    restore_segments,
    segment_changes,
)
from tailguard.streams.errors import CorruptStateError
from tailguard.streams.rag import RagThreshold

__all__ = ["CapacityStore", "Writes"]

_SEP = "\x1f"


def _segment_key(key: str, number: int) -> bytes:
    """Table key of segment ``number`` of deployment ``key`` (service|model)."""
    return f"O{_SEP}{key}{_SEP}{number}".encode()


@dataclass(slots=True)
class Writes:
    """A save's writes, in order: the puts, then the deletes."""

    puts: list[tuple[bytes, bytes]] = field(default_factory=list)
    deletes: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class CapacityStore:
    """Deployments read from the table (kept in memory until the next assignment)."""

    table: object
    tuning: CapacityTuning
    partitions: int
    #: Called with the key and the error when a stored value does not decode (it
    #: is then discarded: the deployment starts that part afresh).
    corrupt: Callable[[bytes, CorruptStateError], None]
    deployments: dict[str, Deployment] = field(default_factory=dict)
    #: Deployments read back from the table (restart, rebalance).
    restored: int = 0

    def partition(self, key: str) -> int:
        """The table partition of deployment ``key`` (service|model)."""
        partition: int = partition_of(key, self.partitions)
        return partition

    def _get(self, key: str, raw_key: bytes) -> bytes | None:
        found: bytes | None = read_partition(self.table, self.partition(key), raw_key)
        return found

    def load(self, service: str, model: str) -> Deployment:
        """The deployment from memory, else from the table, else new."""
        key = f"{service}|{model}"
        dep = self.deployments.get(key)
        if dep is not None:
            return dep
        tune = self.tuning
        dep = Deployment.new(service, model, tune)
        ckey, ekey, kkey = (f"{kind}{_SEP}{key}".encode() for kind in "CEK")
        raw = self._get(key, ckey)
        if raw is not None:
            try:
                core = decode_core(
                    raw,
                    interval_ms=tune.interval_ms,
                    grace_ms=tune.grace_ms,
                    knee=tune.knee,
                    warmup_after=tune.warmup_after,
                )
                restore_segments(core, [self._segment(key, n) for n, _ in core.segments])
                dep.core = core
                self.restored += 1
            except CorruptStateError as exc:
                self.corrupt(ckey, exc)
        raw = self._get(key, kkey)
        if raw is not None:
            try:
                dep.core.knee = decode_knee(raw, tune.knee)
            except CorruptStateError as exc:
                self.corrupt(kkey, exc)
        elif dep.core.knee.samples:
            dep.knee_dirty = True  # a core written with its history (older workers): move it
        raw = self._get(key, ekey)
        if raw is not None:
            try:
                dep.experts = decode_experts(raw, tune.breaker)
            except CorruptStateError as exc:
                self.corrupt(ekey, exc)
        self.deployments[key] = dep
        return dep

    def _segment(self, key: str, number: int) -> bytes:
        raw = self._get(key, _segment_key(key, number))
        if raw is None:
            msg = f"segment {number} of the open intervals is missing"
            raise CorruptStateError(msg)
        return raw

    def rag_tracker(self, dep: Deployment, index: str) -> RagThreshold:
        """The threshold tracker of one RAG index of ``dep`` (read once, then kept)."""
        tracker = dep.rag.get(index)
        if tracker is not None:
            return tracker
        key = f"{dep.service}|{dep.model}"
        rkey = f"R{_SEP}{key}{_SEP}{index}".encode()
        raw = self._get(key, rkey)
        tracker = None
        if raw is not None:
            try:
                tracker = decode_rag(raw, self.tuning.rag)
            except CorruptStateError as exc:
                self.corrupt(rkey, exc)
        if tracker is None:
            tracker = RagThreshold(self.tuning.rag)
        dep.rag[index] = tracker
        return tracker

    def save(self, dep: Deployment, writes: Writes) -> None:
        """Add to ``writes`` what changed of ``dep``: the new values of the open
        intervals (a segment), breakers, indexes and knee first, the core last, then
        the deletes of the segments whose intervals have all closed. ``dep`` then
        counts as written."""
        key = f"{dep.service}|{dep.model}"
        segment, done = segment_changes(dep.core)
        if segment is not None:
            number, data = segment
            writes.puts.append((_segment_key(key, number), data))
        if dep.experts_dirty:
            writes.puts.append((f"E{_SEP}{key}".encode(), encode_experts(dep.experts)))
            dep.experts_dirty = False
        for index in sorted(dep.rag_dirty):
            writes.puts.append((f"R{_SEP}{key}{_SEP}{index}".encode(), encode_rag(dep.rag[index])))
        dep.rag_dirty.clear()
        if dep.knee_dirty:
            writes.puts.append((f"K{_SEP}{key}".encode(), encode_knee(dep.core.knee)))
            dep.knee_dirty = False
        writes.puts.append((f"C{_SEP}{key}".encode(), encode_core(dep.core, history=False)))
        # A crash before these leaves the segments behind, listed by no core.
        writes.deletes += [_segment_key(key, number) for number in done]
