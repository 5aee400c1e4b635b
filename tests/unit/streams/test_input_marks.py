"""Forwarded rows applied once by input position, however a replay cuts them."""

from hypothesis import given
from hypothesis import strategies as st
from tailguard.streams.input_marks import Marks, Run, unapplied


def test_the_documented_example() -> None:
    marks: Marks = {0: (41, 2)}
    runs: list[Run] = [(0, 41, 0, 5), (0, 42, 0, 2), (1, 7, 0, 1)]
    assert unapplied(marks, runs, 8) == [(3, 5), (5, 7), (7, 8)]
    assert marks == {0: (42, 1), 1: (7, 0)}


def test_rows_without_positions_or_with_runs_that_do_not_add_up_are_all_applied() -> None:
    marks: Marks = {0: (9, 0)}
    assert unapplied(marks, [], 3) == [(0, 3)]
    assert unapplied(marks, [(0, 5, 0, 2)], 3) == [(0, 3)]
    assert unapplied(marks, [(-1, -1, 0, 3)], 3) == [(0, 3)]
    assert marks == {0: (9, 0)}


# An input stream: per message (partition, offset), how many rows it holds.
messages = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 6)), min_size=1, max_size=25)


def forwarded(stream: list[tuple[int, int]], cuts: list[int]) -> list[list[Run]]:
    """The stream's rows as forwarded messages, cut after every ``cuts`` rows."""
    offsets: dict[int, int] = {}
    rows: list[tuple[int, int, int]] = []  # (partition, offset, index)
    for part, n in stream:
        offsets[part] = offsets.get(part, -1) + 1
        rows += [(part, offsets[part], i) for i in range(n)]
    out: list[list[Run]] = []
    at, k = 0, 0
    while at < len(rows):
        size = cuts[k % len(cuts)]
        k += 1
        piece = rows[at : at + size]
        at += size
        runs: list[Run] = []
        for part, offset, index in piece:
            if runs and runs[-1][:2] == (part, offset):
                p, o, first, count = runs[-1]
                runs[-1] = (p, o, first, count + 1)
            else:
                runs.append((part, offset, index, 1))
        out.append(runs)
    return out


def apply(marks: Marks, batches: list[list[Run]], seen: list[tuple[int, int, int]]) -> None:
    for runs in batches:
        flat = [(p, o, first + i) for p, o, first, count in runs for i in range(count)]
        for lo, hi in unapplied(marks, runs, len(flat)):
            seen += flat[lo:hi]


@given(
    stream=messages,
    first_cuts=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    replay_cuts=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    crash=st.integers(0, 30),
)
def test_a_replay_cut_anywhere_applies_every_row_once(
    stream: list[tuple[int, int]], first_cuts: list[int], replay_cuts: list[int], crash: int
) -> None:
    # The first pass applies some forwarded messages, then the worker dies; the
    # ingest replays the whole stream, forwarded in other cuts.
    first = forwarded(stream, first_cuts)
    marks: Marks = {}
    seen: list[tuple[int, int, int]] = []
    apply(marks, first[: crash % (len(first) + 1)], seen)
    apply(marks, forwarded(stream, replay_cuts), seen)
    want = [
        r
        for runs in forwarded(stream, [10**6])
        for p, o, f, c in runs
        for r in [(p, o, f + i) for i in range(c)]
    ]
    assert sorted(seen) == sorted(want)
    assert len(seen) == len(set(seen))
