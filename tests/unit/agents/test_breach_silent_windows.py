"""The silent detector reads a series' minute and short windows as two separate reads would."""

import pytest
from tailguard.agents.breaches import BreachEngine, window_stats
from tailguard.agents.pipeline import default_slos
from tailguard.agents.state import CachedSeries
from tailguard.streams import SeriesWindows
from tailguard.streams.silent import SilentState, advance_silent

from tests.unit.streams.conftest import T0_MS as T0
from tests.unit.streams.conftest import Event as Ev

MINUTE = 60_000


def history(minutes: int) -> SeriesWindows:
    """``minutes`` closed minutes of requests whose TTFT grows minute by minute."""
    state = SeriesWindows()
    for m in range(minutes):
        state.add(
            [
                Ev(f"e{m}-{i}", T0 + m * MINUTE + i * 1000, ttft_ms=100.0 + 40 * m + i)
                for i in range(30)
            ]
        )
    state.add([Ev("next", T0 + (minutes + 3) * MINUTE, ttft_ms=100.0)])  # closes them all
    return state


@pytest.mark.parametrize("minutes", [1, 2, 7])
def test_silent_state_learnt_at_a_close_is_the_one_of_two_separate_window_reads(
    minutes: int,
) -> None:
    engine = BreachEngine(slos=default_slos(), state_table={}, gpu_table=None)
    policy = engine.silent
    state = history(minutes)
    end = T0 + minutes * MINUTE
    expected = SilentState(series_key="k")
    minute = window_stats(state.window(MINUTE, end), MINUTE)
    short = window_stats(state.window(policy.short_window_ms, end), policy.short_window_ms)
    assert short.window_ms == policy.short_window_ms != minute.window_ms
    expected, _ = advance_silent(expected, end, minute, short, policy)
    state.release_window_cache()

    engine.evaluate_silent("k", CachedSeries(state, 0), end)

    learnt = next(iter(engine._states.values()))
    assert learnt == expected.to_bytes()
