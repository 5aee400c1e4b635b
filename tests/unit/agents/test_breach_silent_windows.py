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


def test_learnt_states_are_checkpointed_in_bulk_into_their_partition_and_read_back(
    tmp_path,
) -> None:
    from tailguard.agents.bulk import BulkWriter

    from tests.unit.agents.test_bulk import FakeOutputs, Table

    table, outputs = Table(tmp_path), FakeOutputs()
    engine = BreachEngine(
        slos=default_slos(), state_table=table, gpu_table=None, writer=BulkWriter(outputs)
    )
    end = T0 + 2 * MINUTE
    for key, partition in (("a", 1), ("b", 1), ("c", 2)):
        engine.evaluate_silent(key, CachedSeries(history(2), partition), end)
    learnt = dict(engine._states)

    assert engine.checkpoint(1) == 2
    on_disk = {bytes(k): bytes(v) for k, v in table.data._db_for_partition(1).items()}
    assert on_disk == {k: v for k, v in learnt.items() if k[:1] in (b"a", b"b")}
    assert [(p, k) for _, p, k, _ in outputs.records] == sorted((1, k) for k in on_disk)
    assert not list(table.data._db_for_partition(2).keys()), "written at its own checkpoint"

    # A restarted engine reads the states from the partition's database.
    fresh = BreachEngine(slos=default_slos(), state_table=table, gpu_table=None)
    skey, state = fresh._silent_state("a", 1)
    assert state.to_bytes() == learnt[skey]
    assert fresh._silent_state("a", 2)[1] == SilentState(series_key="a"), "not partition 2's"
