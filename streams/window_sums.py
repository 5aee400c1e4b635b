"""Counters of several windows of one series ending at one end, added up once.

A minute's close screens every series' short burn windows (5m, 30m, 2h, 6h),
all ending at the minute. Each is the most recent part of the next: a series
with days of history reads 5, 30, 56 and 60 buckets for them, 151 rows added
up where the 60 of the largest would do. :func:`nested_sums` stacks the rows of
the largest window once and gives every window that is its tail the sum of
its last rows (a running sum from the newest bucket back); a window that is
not its tail is added up alone (:func:`~tailguard.streams.bucket.sum_counters`).
Integers either way: the counters are the same.
"""

import operator
from collections.abc import Sequence
from itertools import repeat

import numpy as np
from tailguard.streams.bucket import Bucket, sum_counters
from tailguard.streams.counters import Counters

__all__ = ["nested_sums"]


def nested_sums(tiers: Sequence[tuple[list[Bucket], list[Bucket]]]) -> list[Counters]:
    """The counters of each window of ``tiers`` (its hour and its minute buckets,
    each oldest first), as :func:`sum_counters` gives them. Read them, do not
    change them: a window of one bucket is that bucket's counters, and windows
    of the same buckets share one object."""
    if not tiers:
        return []
    if all(map(operator.is_, tiers, repeat(tiers[0]))):
        # One answer for every window (a young series: its windows hold its minutes).
        hours, minutes = tiers[0]
        return [_alone(hours + minutes)] * len(tiers)
    windows = [hours + minutes for hours, minutes in tiers]
    largest = max(windows, key=len)
    tails: np.ndarray | None = None  # tails[k]: the sum of the largest's last k rows
    out: list[Counters] = []
    done: dict[int, Counters] = {}  # by length: a tail of that length, added up
    for parts in windows:
        n = len(parts)
        if n <= 1 or not all(map(operator.is_, parts, largest[len(largest) - n :])):
            out.append(_alone(parts))  # one bucket, or not the largest's tail
            continue
        found = done.get(n)
        if found is None:
            if tails is None:
                rows = np.array([part.counter_row() for part in reversed(largest)])
                tails = np.concatenate([np.zeros((1, rows.shape[1]), np.int64), rows.cumsum(0)])
            found = done[n] = Counters.from_list(tails[n].tolist())
        out.append(found)
    return out


def _alone(parts: list[Bucket]) -> Counters:
    """A window's counters added up on their own (one bucket's are its own)."""
    if len(parts) == 1:
        return parts[0].counters
    return sum_counters(parts)
