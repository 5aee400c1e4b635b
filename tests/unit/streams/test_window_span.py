"""Which buckets a window holds: the shortcut for windows holding every held minute.

The shortcut is conservative (a window may hold every minute for other reasons);
where it applies it gives what the full rule gives."""

from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.streams.window_config import RingConfig
from tailguard.streams.window_span import starts_by_rule, window_starts, within_recent

MINUTE = 60_000
CONFIG = RingConfig()


@settings(max_examples=300, deadline=None)
@given(
    held=st.sets(st.integers(0, 300), min_size=1, max_size=12),
    end_minute=st.integers(0, 320),
    window_minutes=st.sampled_from([1, 5, 30, 60, 120, 360, 1440, 4320]),
)
def test_a_window_within_the_recent_minutes_holds_every_minute_held(
    held: set[int], end_minute: int, window_minutes: int
) -> None:
    minutes = sorted(m * MINUTE for m in held)
    end, window_ms = end_minute * MINUTE, window_minutes * MINUTE
    if within_recent(minutes, CONFIG, window_ms, end):
        assert starts_by_rule(minutes, [], CONFIG, window_ms, end) == ([], minutes)
    by_rule = starts_by_rule(minutes, [], CONFIG, window_ms, end)
    assert window_starts(minutes, [], CONFIG, window_ms, end) == by_rule


def test_a_young_series_takes_the_shortcut_for_every_window() -> None:
    end = 500 * MINUTE
    minutes = [end - 2 * MINUTE, end - MINUTE]
    for window_minutes in (5, 60, 4320):
        assert within_recent(minutes, CONFIG, window_minutes * MINUTE, end)
    assert not within_recent(minutes, CONFIG, MINUTE, end), "the older minute is outside"
    assert not within_recent([*minutes, end], CONFIG, 5 * MINUTE, end), "one at the end is not in"


def test_a_young_series_closing_a_minute_takes_the_shortcut() -> None:
    """The request that closes a minute opens the next one: the window of the closed
    minute holds the minutes before its end, and the shortcut still applies."""
    end = 500 * MINUTE
    minutes = [end - 2 * MINUTE, end - MINUTE, end]
    for window_minutes in (5, 60, 4320):
        window_ms = window_minutes * MINUTE
        expected = starts_by_rule(minutes, [], CONFIG, window_ms, end)
        assert expected == ([], minutes[:2])
        assert window_starts(minutes, [], CONFIG, window_ms, end) == expected
