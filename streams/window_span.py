"""Which held buckets a window ``[end − W, end)`` reads: whole hours from the hour
tier, the other minutes from the minute tier.

Pure: it takes the starts of the held buckets (each tier sorted) and the ring's
configuration, and gives the starts to read. :class:`~tailguard.streams.ring.SeriesRing`
maps them to its buckets and remembers the answer while its buckets stay the same.
"""

from bisect import bisect_left, bisect_right

from tailguard.streams.window_config import RingConfig

__all__ = ["starts_by_rule", "window_starts", "within_recent"]


def within_recent(minutes: list[int], config: RingConfig, window_ms: int, end: int) -> bool:
    """Whether every start of ``minutes`` (sorted) is a minute :func:`window_starts`
    keeps for the window of ``window_ms`` ending at ``end`` without looking at
    hours: inside the window, before its end, and recent enough to be held
    whatever the batching."""
    horizon = end - (config.fine_retention_ms - config.allowed_lateness_ms - config.bucket_ms)
    return minutes[0] >= max(end - window_ms, horizon) and minutes[-1] < end


def window_starts(
    minutes: list[int], hours: list[int], config: RingConfig, window_ms: int, end: int
) -> tuple[list[int], list[int]]:
    """The starts of the hour and of the minute buckets a window holds, each in time
    order. ``minutes`` and ``hours``: the starts held in each tier, sorted."""
    if not hours and minutes:
        # Minutes at or past the end are never in the window: at a minute's close
        # a young series already holds the next minute, opened by the request
        # that closed this one.
        held = minutes if minutes[-1] < end else minutes[: bisect_left(minutes, end)]
        if held and within_recent(held, config, window_ms, end):
            return [], list(held)  # every minute before the end (a young series' windows)
    return starts_by_rule(minutes, hours, config, window_ms, end)


def starts_by_rule(
    minutes: list[int], hours: list[int], config: RingConfig, window_ms: int, end: int
) -> tuple[list[int], list[int]]:
    """:func:`window_starts` without the shortcut of :func:`within_recent`."""
    start = end - window_ms
    rollup = config.rollup_ms
    # Minute buckets this recent are always still held when a window ending
    # at ``end`` is read; older ones may or may not be, depending on how far
    # the watermark ran ahead (batching). Using only these keeps every
    # window a function of the events alone.
    horizon = end - (config.fine_retention_ms - config.allowed_lateness_ms - config.bucket_ms)
    used = hours[bisect_left(hours, start) : bisect_right(hours, end - rollup)]
    lo, hi = bisect_left(minutes, start), bisect_left(minutes, end)
    fine: list[int] = []

    def take(a: int, b: int) -> None:  # minutes[a:b], none in a used hour
        for s in minutes[a:b]:
            hour = s - s % rollup
            # A whole hour not rolled up yet still has all its minutes (pruning
            # only follows roll-up); a partial hour counts only its recent minutes.
            if (hour >= start and hour + rollup <= end) or s >= horizon:
                fine.append(s)

    # The minutes of a used hour are in its hour bucket: skip each such run by
    # bisection (over days, most minutes of a window are), only the hours
    # that overlap the held minutes.
    at = lo
    if lo < hi:
        for hour in used[bisect_right(used, minutes[lo] - rollup) :]:
            if hour > minutes[hi - 1]:
                break
            cut = bisect_left(minutes, hour, at, hi)
            take(at, cut)
            at = bisect_left(minutes, hour + rollup, cut, hi)
    take(at, hi)
    return used, fine
