"""Which forwarded rows a state has applied already, by the input position of their event.

The ingest agent acknowledges its input at checkpoints, so after a crash it
reads (and forwards) again everything since the last one. A consumer of what
it forwards tells those replays apart by where each row came from: the
*input position* of its event (input partition, offset of the input message)
and the row's index among that message's rows for the same key. Rows travel
in *runs* — ``(partition, offset, first index, count)``, consecutive rows of
one input message — and a state keeps, per input partition, the newest
``(offset, index)`` it applied::

    applied {0: (41, 2)}   runs (0, 41, 0, 5) (0, 42, 0, 2) (1, 7, 0, 1)
                            rows 0–2 skipped ─┘  3–4 applied ┘ applied ─┘  → {0: (42, 1), 1: (7, 0)}

A run cut in two across forwarded messages (a size bound) continues at its
first index, so a replay that stops in the middle of an input message resumes
after its last applied row. A run with partition −1 has no position: always
applied.
"""

from collections.abc import Sequence

__all__ = ["Marks", "Run", "unapplied"]

#: Input partition, offset of the input message, index of the run's first row
#: among that message's rows (of one key), number of rows.
Run = tuple[int, int, int, int]
#: Input partition → newest (offset, row index) applied.
Marks = dict[int, tuple[int, int]]


def unapplied(marks: Marks, runs: Sequence[Run], n_rows: int) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` ranges of ``n_rows`` rows to apply; ``marks`` move past them.

    ``runs`` cover the rows in order; when they do not add up to ``n_rows``
    (or are absent: rows of an older forwarder), every row is applied.
    """
    if sum(run[3] for run in runs) != n_rows:
        return [(0, n_rows)] if n_rows else []
    out: list[tuple[int, int]] = []
    at = 0
    for part, offset, first, count in runs:
        lo, hi = at, at + count
        at = hi
        if part >= 0:
            done = marks.get(part)
            if done is not None:
                if offset < done[0]:
                    continue
                if offset == done[0]:
                    lo += min(count, max(0, done[1] + 1 - first))
            if lo < hi:
                last = (offset, first + count - 1)
                if done is None or last > done:
                    marks[part] = last
        if lo < hi:
            out.append((lo, hi))
    return out
