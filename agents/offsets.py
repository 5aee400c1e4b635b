"""In-order delivery per input partition, whatever faust's fetcher does around a seek.

Every idempotent state update in tailguard (SLI buckets, prompt SLIs) keeps,
per input partition, the highest offset it has folded in, and treats anything
at or below it as a replay. That is only sound if the *first* delivery of each
message of a partition comes in offset order. faust does not guarantee it:

- Its fetch loop runs concurrently with the seek to the committed offsets that
  ends every rebalance. Records fetched before the seek keep arriving after it,
  so a partition can deliver ``77 78 … 120`` (old position) interleaved with
  ``77 78 …`` (new position).
- It remembers the last offset read per partition and silently *drops*
  anything below it, and it *acknowledges* any jump forward as a gap
  (meant for compacted topics and transaction markers). Against a stale
  "last read" both lose messages: observed as ``drop offset=77 read=120``
  followed by ``gap 78..88`` auto-acknowledged, on a worker just restarted.

:class:`InOrderGuard` is the rule the consumer applies to every record of an
acknowledged topic before faust sees it::

    next expected  n                    record offset o
    ─────────────────────────────────────────────────────────────────────
    unknown        (fresh partition)    deliver, n = o + 1
    o == n                              deliver, n = o + 1
    o <  n                              drop: delivered before, or below the
                                        seek target (committed already)
    o >  n, first time                  hole: discard the rest of the batch
                                        and seek back to n
    o >  n, again right after that seek a real gap (transaction marker,
                                        compaction, retention): deliver and
                                        acknowledge n … o-1, n = o + 1

A seek sets ``n`` to its target first. From the moment the rebalance's seek
to the committed offsets begins (:meth:`InOrderGuard.resync`) until faust
resumes the flow, every record is discarded: resuming empties the streams'
queues, so a record let through in between would be lost (seen on a fresh
start: an admin command never answered). Then the partitions are released at
their targets, and those that discarded records are sought again. So whatever order the
fetcher produces, what reaches a stream is each partition's log from the
committed offset on, in order, with replays only of what was already
delivered.

Pure bookkeeping (no faust, no I/O): the consumer in :mod:`.app` performs the
seeks and gap acknowledgements the verdicts ask for.
"""

from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum

__all__ = ["InOrderGuard", "Verdict", "VerdictKind"]


class VerdictKind(Enum):
    DELIVER = "deliver"
    #: Deliver, and acknowledge the offsets ``gap_from … gap_to`` that hold no record.
    DELIVER_AFTER_GAP = "deliver_after_gap"
    DROP = "drop"
    #: Discard this record and the rest of its batch; seek the partition to ``seek_to``.
    SEEK = "seek"
    #: Discard: the partition is being sought and its target is not known yet.
    HOLD = "hold"


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: VerdictKind
    seek_to: int = -1
    gap_from: int = -1
    gap_to: int = -1


_DELIVER = Verdict(VerdictKind.DELIVER)
_DROP = Verdict(VerdictKind.DROP)
_HOLD = Verdict(VerdictKind.HOLD)


class InOrderGuard:
    """Next expected offset per partition, and the verdict for each record."""

    def __init__(self) -> None:
        self._next: dict[Hashable, int] = {}
        #: Partitions whose seek target is being looked up.
        self._resyncing: set[Hashable] = set()
        #: Partitions that discarded records while resyncing (so need a seek after).
        self._held: set[Hashable] = set()
        #: (expected, offset) of the last hole sought back from, per partition.
        self._probe: dict[Hashable, tuple[int, int]] = {}
        self.dropped = 0
        self.holes = 0
        self.gaps = 0

    def admit(self, tp: Hashable, offset: int) -> Verdict:
        """What to do with the record at ``offset`` of ``tp``."""
        if tp in self._resyncing:
            self._held.add(tp)
            return _HOLD
        expected = self._next.get(tp)
        if expected is None or offset == expected:
            self._next[tp] = offset + 1
            self._probe.pop(tp, None)
            return _DELIVER
        if offset < expected:
            self.dropped += 1
            return _DROP
        if self._probe.get(tp) == (expected, offset):
            # The same record came first again right after seeking back: the
            # offsets in between hold no record.
            del self._probe[tp]
            self._next[tp] = offset + 1
            self.gaps += 1
            return Verdict(VerdictKind.DELIVER_AFTER_GAP, gap_from=expected, gap_to=offset - 1)
        self._probe[tp] = (expected, offset)
        self.holes += 1
        return Verdict(VerdictKind.SEEK, seek_to=expected)

    def expected(self, tp: Hashable) -> int | None:
        """The next offset ``tp`` should deliver (None: unknown)."""
        return self._next.get(tp)

    def sought(self, tp: Hashable, offset: int | None) -> None:
        """``tp`` is (being) sought to ``offset``; None: to wherever it starts (unknown)."""
        self._resyncing.discard(tp)
        self._held.discard(tp)
        if offset is None:
            self._next.pop(tp, None)
        else:
            self._next[tp] = offset

    def resync(self, tps: list[Hashable]) -> None:
        """``tps`` are about to be sought to targets not known yet: hold their records."""
        self._resyncing.update(tps)

    def resynced(self, targets: dict[Hashable, int | None]) -> list[Hashable]:
        """The targets of :meth:`resync` are known; returns the partitions that
        discarded records meanwhile (the caller must seek them again)."""
        again = [tp for tp in targets if tp in self._held]
        for tp, offset in targets.items():
            self.sought(tp, offset)
        return again

    def forget(self, tps: list[Hashable]) -> None:
        """``tps`` were revoked."""
        for tp in tps:
            self._next.pop(tp, None)
            self._probe.pop(tp, None)
            self._resyncing.discard(tp)
            self._held.discard(tp)
