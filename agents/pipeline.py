"""Assemble a worker: app, topics, tables, state and agents."""

from dataclasses import dataclass

import faust
from tailguard.agents.app import make_app
from tailguard.agents.ingest import register_ingest
from tailguard.agents.settings import Settings
from tailguard.agents.sli import register_sli
from tailguard.agents.state import SeriesStore
from tailguard.agents.stats import WorkerStats
from tailguard.agents.tables import Tables, declare_tables
from tailguard.agents.topics import Topics, declare_topics
from tailguard.streams import RingConfig

__all__ = ["Pipeline", "build"]


@dataclass(slots=True)
class Pipeline:
    """Everything one worker runs."""

    app: faust.App
    settings: Settings
    topics: Topics
    tables: Tables
    store: SeriesStore
    stats: WorkerStats


def build(settings: Settings) -> Pipeline:
    """A fully wired worker for ``settings`` (not started)."""
    app = make_app(settings)
    topics = declare_topics(app, settings)
    tables = declare_tables(app, settings)
    ring = RingConfig(allowed_lateness_ms=settings.allowed_lateness_ms)
    store = SeriesStore(tables.series_meta, tables.series_buckets, ring)
    stats = WorkerStats()
    register_ingest(app, topics, settings, stats)
    register_sli(app, topics, settings, stats, store)

    @app.timer(30.0, name="tailguard.stats")
    async def log_stats() -> None:
        app.log.info("tailguard %s", stats.line())

    return Pipeline(app, settings, topics, tables, store, stats)
