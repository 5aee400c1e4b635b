"""Input partitions that stopped feeding a series, so that it stops waiting for them.

A series' watermark is the lowest of the watermarks of the input partitions
that feed it (:mod:`tailguard.streams.ring`). A partition that fed a series
and then no more (a producer that changed its keys, a one-off message) would
hold that series' closes back for good: once it has brought the series
nothing for ``feeder_idle_s`` seconds of wall time while its watermark is
behind another partition's, the series forgets it (its next request, if any,
is judged against the series' watermark).

Wall time, not event time: catching up after a restart, one partition may run
far ahead of another in event time without either having stopped.
"""

from collections.abc import Iterable

from tailguard.agents.state import CachedSeries

__all__ = ["IdleFeeders"]


class IdleFeeders:
    """Watches the input positions of series with several feeding partitions."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        #: ``(series, partition)`` → (newest input offset seen, wall time first seen).
        self._marks: dict[tuple[str, int], tuple[int, float]] = {}

    def idle(
        self, series: Iterable[tuple[str, CachedSeries]], now: float
    ) -> list[tuple[str, CachedSeries, int]]:
        """The ``(series, cached, partition)`` whose partition has not moved the
        series' input position for ``idle_s`` (wall time ``now``, in seconds) and
        holds its watermark back (another partition brought newer requests). A
        series all of whose partitions stand at the same time waits for them all."""
        found: list[tuple[str, CachedSeries, int]] = []
        marks: dict[tuple[str, int], tuple[int, float]] = {}
        for key, cached in series:
            state = cached.state
            feeders = state.feeders
            if len(feeders) < 2:
                continue
            newest = max(feeders.values())
            for partition, wm in feeders.items():
                mark = state.replay_floor(partition)
                before = self._marks.get((key, partition))
                if before is None or before[0] != mark:
                    before = (mark, now)
                marks[(key, partition)] = before
                if wm < newest and now - before[1] >= self.idle_s:
                    found.append((key, cached, partition))
        self._marks = marks
        return found
