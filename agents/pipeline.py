"""Assemble a worker: app, topics, tables, state and agents."""

from dataclasses import dataclass

import faust
from tailguard.agents.app import make_app
from tailguard.agents.breaches import BreachEngine, thresholds_resolver
from tailguard.agents.gpu import GpuCache, register_gpu
from tailguard.agents.ingest import register_ingest
from tailguard.agents.outputs import Outputs
from tailguard.agents.settings import Settings
from tailguard.agents.sli import register_sli
from tailguard.agents.state import SeriesStore
from tailguard.agents.stats import WorkerStats
from tailguard.agents.tables import Tables, declare_tables
from tailguard.agents.topics import Topics, declare_topics
from tailguard.schemas.openslo import default_slos, load_slos
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
    engine: BreachEngine
    gpu_cache: GpuCache
    stats: WorkerStats


def build(settings: Settings) -> Pipeline:
    """A fully wired worker for ``settings`` (not started)."""
    app = make_app(settings)
    topics = declare_topics(app, settings)
    tables = declare_tables(app, settings)
    ring = RingConfig(allowed_lateness_ms=settings.allowed_lateness_ms)
    slos = load_slos(settings.slo_file) if settings.slo_file else default_slos()
    store = SeriesStore(tables.series_meta, tables.series_buckets, ring, thresholds_resolver(slos))
    gpu_cache = GpuCache(settings.broker, topics.gpu.get_topic_name())
    engine = BreachEngine(slos=slos, state_table=tables.breach_state, gpu_table=gpu_cache)
    stats = WorkerStats()
    register_ingest(app, topics, settings, stats)
    register_gpu(app, topics, settings, stats, tables.gpu_latest)
    outputs = Outputs(settings.broker)
    register_sli(app, topics, settings, stats, store, engine, outputs)

    @app.timer(settings.stats_interval_s, name="tailguard.stats")
    async def log_stats() -> None:
        app.log.info("tailguard %s", stats.line())

    return Pipeline(app, settings, topics, tables, store, engine, gpu_cache, stats)
