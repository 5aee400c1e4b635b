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


@settings(max_examples=300, deadline=None)
@given(
    ages=st.sets(st.integers(-3, 130), min_size=1, max_size=30),
    hours_ago=st.sets(st.integers(3, 6), max_size=2),
    windows=st.lists(
        st.one_of(st.sampled_from([1, 5, 30, 60, 120, 360, 1440, 4320]), st.integers(1, 400)),
        min_size=2,
        max_size=10,
    ),
    new_age=st.integers(-3, 130),
)
def test_windows_read_one_after_another_hold_what_each_holds_read_alone(
    ages: set[int], hours_ago: set[int], windows: list[int], new_age: int
) -> None:
    """A close reads a dozen windows of one end in turn, and a window that holds
    every held minute, all recent, is remembered for every longer one: each read
    still holds what a minute-by-minute check finds, minutes held past the end,
    older than the recent horizon or in whole hours included, and a bucket made
    between reads is seen."""
    end = 100 * HOUR
    ring = SeriesRing(RingConfig())
    ring.coarse = {end - h * HOUR: Bucket.empty(end - h * HOUR) for h in hours_ago}
    ring.fine = {end - a * MINUTE: Bucket.empty(end - a * MINUTE) for a in ages}
    for _ in range(2):
        for window_min in windows:
            got_hours, got_minutes = ring._tiers(window_min * MINUTE, end)
            want_hours, want_minutes = every_minute_checked(ring, window_min * MINUTE, end)
            assert [b.start_ms for b in got_hours] == want_hours
            assert [b.start_ms for b in got_minutes] == want_minutes
        if end - new_age * MINUTE not in ring.fine:
            ring._new_fine(end - new_age * MINUTE)
