"""A quiet close of a series none of whose SLOs has a state reads no state twice,
and a series with a state is still evaluated when it goes quiet."""

from typing import Any

from tailguard.agents.breaches import BreachEngine
from tailguard.agents.pipeline import default_slos
from tailguard.agents.state import CachedSeries
from tailguard.streams import SeriesWindows
from tailguard.streams.burn import BurnPolicy, BurnRule

from tests.unit.streams.conftest import T0_MS as T0
from tests.unit.streams.conftest import Event as Ev

MINUTE = 60_000
SERIES = ("chat", "m1", "default", "default")
KEY = "|".join(SERIES)


class CountingTable(dict[bytes, bytes]):
    """A state table that counts its reads."""

    reads = 0

    def get(self, key: bytes, default: Any = None) -> Any:
        self.reads += 1
        return super().get(key, default)


def minutes(state: SeriesWindows, first: int, count: int, *, failing: bool) -> None:
    """``count`` minutes from minute ``first``, 200 requests each, all errors or all fine."""
    for m in range(first, first + count):
        state.add(
            [
                Ev(
                    f"e{m}-{i}",
                    T0 + m * MINUTE + i * 250,
                    ttft_ms=100.0,
                    status="error" if failing else "ok",
                )
                for i in range(200)
            ]
        )


def close(engine: BreachEngine, cached: CachedSeries, specs: list[Any], minute: int) -> list[Any]:
    """The SLO transitions of the close of ``minute``, as a minute's close asks (screened first)."""
    return engine.evaluate_many([(SERIES, KEY, cached, specs, T0 + minute * MINUTE)])[0]


def test_a_quiet_series_with_no_state_is_looked_up_once_per_slo_list_and_partition() -> None:
    table = CountingTable()
    engine = BreachEngine(slos=default_slos(), state_table=table, gpu_table=None)
    looked_up: list[bytes] = []
    read = engine._read

    def spy(skey: bytes, partition: int) -> bytes | None:
        looked_up.append(skey)
        return read(skey, partition)

    engine._read = spy  # type: ignore[method-assign]
    state = SeriesWindows()
    minutes(state, 0, 4, failing=False)
    cached, specs = CachedSeries(state, 0), engine.specs_for(SERIES)
    assert specs

    assert close(engine, cached, specs, 2) == []
    assert len(looked_up) == table.reads == len(specs)
    assert close(engine, cached, specs, 3) == []
    assert len(looked_up) == len(specs), "known to have no state: nothing looked up"

    assert close(engine, cached, list(specs), 3) == []
    assert len(looked_up) == 2 * len(specs), "another SLO list: its states are looked up"
    engine.forget_partitions({0})
    assert close(engine, cached, list(specs), 3) == []
    assert len(looked_up) == 3 * len(specs) and table.reads == 2 * len(specs)


def test_an_open_breach_resolves_once_its_series_goes_quiet() -> None:
    """With the fast page rule alone (1h over 5m), 20 failing minutes open a
    breach, and an hour of fine ones lets it resolve: the quiet closes after
    it opened still evaluate the series (it has a state)."""
    engine = BreachEngine(
        slos=default_slos(),
        state_table=CountingTable(),
        gpu_table=None,
        burn=BurnPolicy(rules=(BurnRule("page", 14.4, "1h", "5m"),)),
    )
    state = SeriesWindows()
    cached, specs = CachedSeries(state, 0), engine.specs_for(SERIES)
    minutes(state, 0, 3, failing=False)
    assert close(engine, cached, specs, 2) == []  # quiet, and no state yet
    minutes(state, 3, 20, failing=True)
    opened = [t for m in range(3, 23) for t in close(engine, cached, specs, m)]
    assert "opened" in {t.state for t in opened}

    minutes(state, 23, 90, failing=False)
    later = [t for m in range(23, 112) for t in close(engine, cached, specs, m)]
    resolved = {t.breach_id for t in later if t.state == "resolved"}
    assert resolved == {t.breach_id for t in opened if t.state == "opened"}
