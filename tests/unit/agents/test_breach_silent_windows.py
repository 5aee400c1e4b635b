"""The silent detector reads a series' minute and short windows as two separate reads would."""

from typing import Any

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

    assert engine.write(1, engine.take(1)) == 2
    on_disk = {bytes(k): bytes(v) for k, v in table.data._db_for_partition(1).items()}
    assert on_disk == {k: v for k, v in learnt.items() if k[:1] in (b"a", b"b")}
    assert [(p, k) for _, p, k, _ in outputs.records] == sorted((1, k) for k in on_disk)
    assert not list(table.data._db_for_partition(2).keys()), "written at its own checkpoint"

    # A restarted engine reads the states from the partition's database.
    fresh = BreachEngine(slos=default_slos(), state_table=table, gpu_table=None)
    skey, state = fresh._silent_state("a", 1)
    assert state.to_bytes() == learnt[skey]
    assert fresh._silent_state("a", 2)[1] == SilentState(series_key="a"), "not partition 2's"


def _minute_of(n: int, *, ttft: bool, stages: bool) -> SeriesWindows:
    """One closed minute of ``n`` requests (over 1,000: its sketches are digests)."""
    state = SeriesWindows()
    state.add(
        [
            Ev(
                f"e{i}",
                T0 + i * 60_000 // n,
                ttft_ms=100.0 + (i * 37) % 500 if ttft else None,
                output_tokens=11 if ttft else 0,
                stages_ms={"queue": 5.0 + i % 90, "prefill": 40.0 + (i * 7) % 300}
                if stages
                else None,
            )
            for i in range(n)
        ]
    )
    state.add([Ev("next", T0 + 3 * MINUTE)])  # closes the minute
    return state


@pytest.mark.parametrize(
    ("n", "ttft", "stages"), [(60, True, True), (2_500, True, True), (40, False, False)]
)
def test_the_minute_read_from_its_snapshot_summary_is_the_minute_read_from_its_sketches(
    n: int, ttft: bool, stages: bool
) -> None:
    from tailguard.streams import summarize

    state = _minute_of(n, ttft=ttft, stages=stages)
    bucket = state.window(MINUTE, T0 + MINUTE)
    summary = summarize(bucket, MINUTE, state.thresholds)

    from_summary = window_stats(bucket, MINUTE, summary)

    assert from_summary == window_stats(bucket, MINUTE)
    assert (from_summary.p95_ttft_ms is None) != ttft
    assert sorted(from_summary.stage_p99_ms) == (["prefill", "queue"] if stages else [])


def _learnt(state: SeriesWindows, end: int, summarised: Any = None) -> bytes:
    """The silent state a fresh engine learns at ``end`` (the windows' cache dropped
    after, so that the next engine reads them anew)."""
    engine = BreachEngine(slos=default_slos(), state_table={}, gpu_table=None)
    engine.evaluate_silent("k", CachedSeries(state, 0), end, summarised)
    state.release_window_cache()
    return next(iter(engine._states.values()))


def test_a_summary_of_another_series_or_end_is_not_taken_for_the_minute() -> None:
    from tailguard.streams import summarize

    state, other = history(2), history(3)
    end = T0 + 2 * MINUTE
    short_ms = BreachEngine(
        slos=default_slos(), state_table={}, gpu_table=None
    ).silent.short_window_ms
    stranger = other.window(MINUTE, T0 + 3 * MINUTE)
    wrong = (stranger, summarize(stranger, MINUTE, other.thresholds))
    elsewhere = {
        (id(other), MINUTE, end): wrong,  # another series' ring
        (id(other), short_ms, end): wrong,
        (id(state), MINUTE, end + MINUTE): wrong,  # another end of this one
        (id(state), short_ms, end + MINUTE): wrong,
    }

    assert _learnt(state, end, elsewhere) == _learnt(state, end)


@pytest.mark.parametrize("minutes", [1, 2, 7])
def test_windows_the_close_summarised_are_judged_as_reading_them_again_is(
    minutes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tailguard.agents.breaches as breaches
    from tailguard.streams import summarize

    judged = []  # the minute's and the short window's figures, as the detector gets them

    def spy(state, end_ms, minute, short, policy):  # type: ignore[no-untyped-def]
        judged.append((minute, short))
        return advance_silent(state, end_ms, minute, short, policy)

    monkeypatch.setattr(breaches, "advance_silent", spy)
    short_ms = BreachEngine(
        slos=default_slos(), state_table={}, gpu_table=None
    ).silent.short_window_ms
    state = history(minutes)
    end = T0 + minutes * MINUTE
    minute, short = state.windows([MINUTE, short_ms], end)
    read = {
        (id(state), MINUTE, end): (minute, summarize(minute, MINUTE, state.thresholds)),
        (id(state), short_ms, end): (short, summarize(short, short_ms, state.thresholds)),
    }
    assert (short is minute) == (minutes == 1)

    learnt = _learnt(state, end, read)

    assert learnt == _learnt(state, end)
    assert SilentState.from_bytes(learnt).baseline.minutes == 1
    (with_summaries, again) = judged
    assert with_summaries == again
    assert with_summaries[1].window_ms == short_ms
    assert (with_summaries[1].requests > with_summaries[0].requests) == (minutes > 1)
