"""Pure computation over event streams: never imports faust, Kafka clients or schemas."""

from tailguard.streams.bucket import METRICS, Bucket, Counters
from tailguard.streams.errors import ConfigError, CorruptStateError, StreamsError
from tailguard.streams.ring import WINDOWS, AddResult, Changes, RingConfig, SeriesWindows
from tailguard.streams.sli import LatencyEvent, Thresholds
from tailguard.streams.summary import PERCENTILES, WindowSummary, summarize, summarize_many

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
