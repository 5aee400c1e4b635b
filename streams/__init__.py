"""Pure computation over event streams: never imports faust, Kafka clients or schemas."""

from tailguard.streams.bucket import METRICS, Bucket
from tailguard.streams.counters import Counters
from tailguard.streams.errors import ConfigError, CorruptStateError, StreamsError
from tailguard.streams.sli import LatencyEvent, Thresholds
from tailguard.streams.summary import PERCENTILES, WindowSummary, summarize, summarize_many
from tailguard.streams.window_config import WINDOWS, AddResult, Changes, RingConfig
from tailguard.streams.windows import SeriesWindows

__all__ = [
    "METRICS",
    "PERCENTILES",
    "WINDOWS",
    "AddResult",
    "Bucket",
    "Changes",
    "ConfigError",
    "CorruptStateError",
    "Counters",
    "LatencyEvent",
    "RingConfig",
    "SeriesWindows",
    "StreamsError",
    "Thresholds",
    "WindowSummary",
    "summarize",
    "summarize_many",
]
