"""RocksDB-backed faust tables (rocksdict driver), sized for small machines."""

from dataclasses import dataclass
from typing import Any

import faust
from tailguard.agents.settings import Settings

__all__ = ["Tables", "declare_tables"]


@dataclass(frozen=True, slots=True)
class Tables:
    """The tables of a worker. Keys and values are bytes; codecs live in ``streams``."""

    series_meta: Any
    series_buckets: Any
    breach_state: Any
    gpu_latest: Any


def declare_tables(app: faust.App, settings: Settings) -> Tables:
    """Plain (non-windowed) tables: event-time windows are explicit buckets in
    ``tailguard.streams``, avoiding faust's windowed tables, which expire on wall-clock
    time, not event time."""

    def table(name: str, help_: str) -> Any:
        return app.Table(
            name,
            default=None,
            partitions=settings.partitions,
            # bytes ↔ faust's "raw" codec for keys, values and the changelog.
            key_type=bytes,
            value_type=bytes,
            options=settings.rocksdb_options(),
            help=help_,
        )

    from tailguard.agents.gpu import declare_gpu_table

    return Tables(
        series_meta=table("tailguard-series", "per-series window meta (watermark, bucket list)"),
        series_buckets=table("tailguard-buckets", "per-series minute and hour buckets"),
        breach_state=table("tailguard-breach-state", "breach lifecycle per series and SLO"),
        gpu_latest=declare_gpu_table(app, settings),
    )
