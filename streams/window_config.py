"""Shapes shared by a series' windows and the code that fills them: the tiers,
the published windows, the ring's configuration, and what a fold reports."""

from dataclasses import dataclass, field

from tailguard.streams.digest import COARSE_MAX_CENTROIDS, DEFAULT_MAX_CENTROIDS
from tailguard.streams.errors import ConfigError

__all__ = [
    "COARSE",
    "FINE",
    "WINDOWS",
    "WM_HISTORY",
    "AddResult",
    "Changes",
    "RecordKey",
    "RingConfig",
]

FINE = "m"
COARSE = "h"
#: Input messages per series whose starting watermark is remembered (only
#: messages processed since the last consumer commit can be replayed).
WM_HISTORY = 256

#: The sliding windows a series is published and judged over, in milliseconds.
WINDOWS: dict[str, int] = {
    "1m": 60_000,
    "5m": 300_000,
    "30m": 1_800_000,
    "1h": 3_600_000,
    "6h": 21_600_000,
    "1d": 86_400_000,
    "3d": 259_200_000,
}


@dataclass(frozen=True, slots=True)
class RingConfig:
    """Bucket widths, retention and lateness. Validated on construction."""

    bucket_ms: int = 60_000
    rollup_ms: int = 3_600_000
    fine_retention_ms: int = 7_200_000
    retention_ms: int = 3 * 86_400_000 + 3_600_000
    allowed_lateness_ms: int = 120_000
    max_centroids: int = DEFAULT_MAX_CENTROIDS
    coarse_max_centroids: int = COARSE_MAX_CENTROIDS

    def __post_init__(self) -> None:
        if self.bucket_ms <= 0 or self.rollup_ms <= 0 or self.rollup_ms % self.bucket_ms:
            msg = (
                f"rollup_ms ({self.rollup_ms}) must be a positive multiple of "
                f"bucket_ms ({self.bucket_ms})"
            )
            raise ConfigError(msg)
        if self.allowed_lateness_ms < 0:
            msg = f"allowed_lateness_ms must be ≥ 0, got {self.allowed_lateness_ms}"
            raise ConfigError(msg)
        need = self.rollup_ms + self.bucket_ms + self.allowed_lateness_ms
        if self.fine_retention_ms < need:
            msg = (
                f"fine_retention_ms ({self.fine_retention_ms}) must cover a roll-up period plus "
                f"lateness (≥ {need}) or minute buckets vanish before they are rolled up"
            )
            raise ConfigError(msg)
        if self.retention_ms < self.fine_retention_ms:
            msg = (
                f"retention_ms ({self.retention_ms}) must be ≥ "
                f"fine_retention_ms ({self.fine_retention_ms})"
            )
            raise ConfigError(msg)
        for name in ("max_centroids", "coarse_max_centroids"):
            value = getattr(self, name)
            if not 20 <= value <= 10_000:
                msg = f"{name} must be in 20..10000, got {value}"
                raise ConfigError(msg)


@dataclass(slots=True)
class AddResult:
    """What one :meth:`~tailguard.streams.windows.SeriesWindows.add` did."""

    accepted: int = 0
    late: int = 0
    duplicates: int = 0
    #: Events skipped because their bucket already holds their input position.
    replayed: int = 0
    #: End times of the minute buckets that closed during this call, oldest first.
    closed_ends: list[int] = field(default_factory=list)


#: A stored record of a bucket: ``(tier, start)`` whole, ``(tier, start, version)``
#: a segment (:mod:`~tailguard.streams.bucket_log`).
RecordKey = tuple[str, int] | tuple[str, int, int]


@dataclass(slots=True)
class Changes:
    """What to write to the state store after a batch: bucket records by
    :data:`RecordKey`, the records to delete, and the series' meta value."""

    upserts: dict[RecordKey, bytes]
    deletes: list[RecordKey]
    meta: bytes
