"""A series stops waiting for an input partition that has stopped feeding it."""

import asyncio
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from tailguard.agents.breaches import BreachEngine
from tailguard.agents.errors import SettingsError
from tailguard.agents.feeders import IdleFeeders
from tailguard.agents.folder import SeriesFolder
from tailguard.agents.pipeline import default_slos
from tailguard.agents.settings import Settings
from tailguard.agents.state import SeriesStore
from tailguard.agents.stats import WorkerStats
from tailguard.streams import RingConfig
from tailguard.streams.columns import Columns

from tests.unit.streams.conftest import T0_MS as T0
from tests.unit.streams.conftest import Event as Ev

KEY = "chat|m1|default|default"
MIN = 60_000


def requests(partition: int, offset: int, times: list[int]) -> Columns:
    events = [Ev(f"p{partition}-{offset}-{i}", ts, ttft_ms=100.0) for i, ts in enumerate(times)]
    return Columns.from_events(events, [(partition, offset)] * len(events))


def fed_by_two(store: SeriesStore) -> Any:
    """A series both partitions fed at T0; then partition 0 alone, 5 minutes on."""
    cached = store.get(KEY, 0)
    cached.state.add_columns(requests(0, 0, [T0]))
    cached.state.add_columns(requests(1, 0, [T0]))
    cached.state.add_columns(requests(0, 1, [T0 + i * 1000 for i in range(1, 300)]))
    return cached


def test_only_a_partition_that_stopped_moving_for_the_idle_time_is_reported() -> None:
    store = SeriesStore({}, {}, RingConfig())
    cached = fed_by_two(store)
    idle = IdleFeeders(idle_s=60)
    assert idle.idle(store.items(), now=0) == []
    cached.state.add_columns(requests(0, 2, [T0 + 300_000]))  # partition 0 moves on
    assert idle.idle(store.items(), now=59) == []
    assert idle.idle(store.items(), now=61) == [(KEY, cached, 1)]


def test_a_series_fed_by_one_partition_is_never_reported() -> None:
    store = SeriesStore({}, {}, RingConfig())
    store.get(KEY, 0).state.add_columns(requests(0, 0, [T0]))
    idle = IdleFeeders(idle_s=1)
    assert idle.idle(store.items(), now=0) == []
    assert idle.idle(store.items(), now=100) == []


def test_partitions_that_stand_at_the_same_time_are_waited_for() -> None:
    store = SeriesStore({}, {}, RingConfig())
    cached = store.get(KEY, 0)
    cached.state.add_columns(requests(0, 0, [T0]))
    cached.state.add_columns(requests(1, 0, [T0]))
    idle = IdleFeeders(idle_s=1)
    assert idle.idle(store.items(), now=0) == []
    assert idle.idle(store.items(), now=100) == []


class _Outputs:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    def send(self, topic: str, key: bytes, value: bytes, headers: Any = None) -> None:
        self.sent.append((topic, key, value))


def _topic(name: str) -> Any:
    return SimpleNamespace(get_topic_name=lambda: name)


def test_forgetting_the_stalled_partition_publishes_the_minutes_it_held_back() -> None:
    store = SeriesStore({}, {}, RingConfig())
    cached = fed_by_two(store)
    assert cached.state.watermark_ms == T0  # held back by partition 1
    topics: Any = SimpleNamespace(
        sli=_topic("sli"), breaches=_topic("breaches"), interference=_topic("interference")
    )
    engine = BreachEngine(slos=default_slos(), state_table={}, gpu_table=None)
    outputs = _Outputs()
    settings = Settings(feeder_idle_s=30)
    folder = SeriesFolder(None, topics, settings, WorkerStats(), store, engine, outputs)  # type: ignore[arg-type]

    # Everything arrived before the first look (a backlog read at once): partition 1
    # is behind and has not moved since, so after the idle time it is let go.
    assert asyncio.run(folder.forget_idle_feeders(0.0)) == 0
    assert cached.state.watermark_ms == T0
    assert asyncio.run(folder.forget_idle_feeders(29.0)) == 0
    assert asyncio.run(folder.forget_idle_feeders(31.0)) == 1
    assert cached.state.feeders.keys() == {0}
    finals = [
        msgspec.json.decode(value)
        for topic, _, value in outputs.sent
        if topic == "sli" and msgspec.json.decode(value)["window"] == "1m"
    ]
    ends = [f["window_end_ms"] for f in finals]
    first_end = T0 - T0 % MIN + MIN
    assert ends and ends[0] == first_end and all(f["final"] for f in finals)
    assert ends == sorted(ends) and ends[-1] <= T0 + 299_000 - 120_000
    assert store.unsaved(0) == 1


def test_the_idle_time_comes_from_the_environment_and_must_be_positive(monkeypatch: Any) -> None:
    monkeypatch.setenv("TAILGUARD_FEEDER_IDLE_S", "45")
    assert Settings.from_env().feeder_idle_s == 45.0
    with pytest.raises(SettingsError, match="feeder_idle_s"):
        Settings(feeder_idle_s=0)
