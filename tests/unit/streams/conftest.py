"""Factory fixtures shared by the ``tailguard.streams`` unit tests.

``Event`` is the smallest value that fits the ``LatencyEvent`` protocol; the
factories hand out events and window states with sensible defaults so that a
test spells out only the fields it is about.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import count
from typing import Any

import pytest
from tailguard.streams import RingConfig, SeriesWindows, Thresholds

#: An hour-aligned event time (2023-11-14 21:00 UTC) that the tests count from.
T0_MS = 1_699_995_600_000
MINUTE_MS = 60_000
HOUR_MS = 3_600_000


@dataclass(slots=True)
class Event:
    """A finished request as the window state reads it (fits ``LatencyEvent``)."""

    event_id: str
    ts_ms: int
    status: str = "ok"
    e2e_ms: float = 1_000.0
    ttft_ms: float | None = 200.0
    output_tokens: int | None = 11
    itl_ms: list[float] | None = None
    trace_id: str | None = None
    warmup: bool | None = False
    stages_ms: dict[str, float] | None = None
    prompt_version: str | None = None
    cache: Any = None
    batch: Any = None
    flow_control: Any = None


MakeEvent = Callable[..., Event]
MakeWindows = Callable[..., SeriesWindows]


@pytest.fixture(scope="session")
def t0() -> int:
    """An hour-aligned event time: minute ``i`` of the first hour starts at ``t0 + i·60 000``."""
    assert T0_MS % HOUR_MS == 0
    return T0_MS


@pytest.fixture(scope="session")
def event_type() -> type[Event]:
    return Event


@pytest.fixture(scope="session")
def make_event() -> MakeEvent:
    """``make_event(ts_ms, **fields)``: an ``ok`` request with a fresh ``event_id``.

    Session-scoped (a pure factory) so that Hypothesis tests may use it.
    """
    ids: Iterator[int] = count()

    def make(ts_ms: int, **fields: Any) -> Event:
        fields.setdefault("event_id", f"ev-{next(ids)}")
        return Event(ts_ms=ts_ms, **fields)

    return make


@pytest.fixture(scope="session")
def make_windows() -> MakeWindows:
    """``make_windows(thresholds=None, **ring_config)``: an empty ``SeriesWindows``."""

    def make(thresholds: Thresholds | None = None, **config: int) -> SeriesWindows:
        return SeriesWindows(RingConfig(**config), thresholds)

    return make
