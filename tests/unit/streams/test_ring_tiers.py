"""The buckets a window holds: skipping the minutes of rolled-up hours by bisection
picks what checking every minute picks."""

from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.streams import RingConfig
from tailguard.streams.bucket import Bucket
from tailguard.streams.ring import SeriesRing

MINUTE, HOUR = 60_000, 3_600_000


def every_minute_checked(ring: SeriesRing, window_ms: int, end: int) -> tuple[list[int], list[int]]:
    """The hour and minute starts of a window, each minute looked at in turn."""
    cfg = ring.config
    start = end - window_ms
    horizon = end - (cfg.fine_retention_ms - cfg.allowed_lateness_ms - cfg.bucket_ms)
    used = sorted(h for h in ring.coarse if start <= h <= end - cfg.rollup_ms)
    fine = []
    for s in sorted(m for m in ring.fine if start <= m < end):
        hour = s - s % cfg.rollup_ms
        if hour in used:
            continue
        if (hour >= start and hour + cfg.rollup_ms <= end) or s >= horizon:
            fine.append(s)
    return used, fine


@settings(max_examples=300, deadline=None)
@given(
    hours=st.sets(st.integers(0, 96)),
    minutes=st.sets(st.integers(0, 96 * 60)),
    window_min=st.sampled_from([1, 5, 30, 60, 120, 360, 1440, 4320]),
    end_min=st.integers(0, 97 * 60),
)
def test_a_window_holds_the_buckets_a_minute_by_minute_check_finds(
    hours: set[int], minutes: set[int], window_min: int, end_min: int
) -> None:
    ring = SeriesRing(RingConfig())
    ring.coarse = {h * HOUR: Bucket.empty(h * HOUR) for h in hours}
    ring.fine = {m * MINUTE: Bucket.empty(m * MINUTE) for m in minutes}
    end = end_min * MINUTE
    got_hours, got_minutes = ring._tiers(window_min * MINUTE, end)
    want_hours, want_minutes = every_minute_checked(ring, window_min * MINUTE, end)
    assert [b.start_ms for b in got_hours] == want_hours
    assert [b.start_ms for b in got_minutes] == want_minutes


@settings(max_examples=100, deadline=None)
@given(
    minutes=st.lists(st.integers(0, 6 * 60), min_size=1, max_size=40),
    window_min=st.sampled_from([1, 5, 60, 360]),
    end_min=st.integers(0, 7 * 60),
)
def test_a_remembered_window_follows_the_buckets_as_they_come(
    minutes: list[int], window_min: int, end_min: int
) -> None:
    """Buckets made one by one (as events open them), each window read between:
    what is remembered of a read never hides a bucket made since."""
    ring = SeriesRing(RingConfig())
    end = end_min * MINUTE
    for m in minutes:
        if m * MINUTE not in ring.fine:
            ring._new_fine(m * MINUTE)
        got_hours, got_minutes = ring._tiers(window_min * MINUTE, end)
        want_hours, want_minutes = every_minute_checked(ring, window_min * MINUTE, end)
        assert [b.start_ms for b in got_hours] == want_hours
        assert [b.start_ms for b in got_minutes] == want_minutes
