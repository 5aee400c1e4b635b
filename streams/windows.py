"""A series' sliding windows with the way events go in: the class agents hold.

:class:`~tailguard.streams.ring.SeriesRing` keeps the buckets, closes them and
reads windows; :mod:`~tailguard.streams.fold` (fresh input, vectorised) and
:mod:`~tailguard.streams.replay` (input that may repeat) fill them. Adding
one batch of one series goes through the same fold as a batch of thousands.
"""

from collections.abc import Callable, Sequence

from tailguard.streams.columns import Columns
from tailguard.streams.fold import fold_many
from tailguard.streams.fold_batch import Ledger
from tailguard.streams.ring import SeriesRing
from tailguard.streams.sli import LatencyEvent
from tailguard.streams.window_config import AddResult

__all__ = ["SeriesWindows"]


class SeriesWindows(SeriesRing):
    """Sliding-window state of one series, and its batch fold."""

    def add(
        self,
        events: Sequence[LatencyEvent],
        positions: Sequence[tuple[int, int]] | None = None,
        on_close: Callable[[int], None] | None = None,
    ) -> AddResult:
        """Fold a batch of event objects in; see :meth:`add_columns`."""
        return self.add_columns(Columns.from_events(events, positions), on_close)

    def add_columns(
        self, cols: Columns, on_close: Callable[[int], None] | None = None
    ) -> AddResult:
        """Fold a batch of requests in, in order; returns counts and closed buckets.

        Each request is judged against the watermark as it stands when it
        arrives, so the outcome does not depend on how the input was batched.

        ``cols.part`` / ``cols.offset`` are the input position of the message
        each request came in (−1: unknown, no replay protection). All requests
        of one input message must arrive in the same call. A bucket that
        already holds an input position skips that position's requests
        (``replayed``): re-delivering input after a crash never counts a
        request twice.

        Buckets close as the watermark passes them; ``on_close(end)`` runs for
        each, oldest first, before roll-up and pruning (see :meth:`_advance`).

        Fresh input (the common case) takes a vectorised path; a replay after
        a crash, or restored buckets waiting to be refilled, take the
        request-by-request path. Both give the same result.
        """
        if len(cols) == 0:
            return AddResult()
        # The same ledger call after call: batches are put in at the next read.
        ledger = self.ledger if self.ledger is not None else Ledger()
        return fold_many([self], cols, [0, len(cols)], [on_close], ledger)[0]
