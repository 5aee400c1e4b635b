"""Assemble a worker: app, topics, tables, state and agents."""

from dataclasses import dataclass
from typing import Any

import faust
from tailguard.agents.admin import AdminPlane, register_admin
from tailguard.agents.app import make_app
from tailguard.agents.breaches import BreachEngine
from tailguard.agents.bulk import BulkWriter
from tailguard.agents.capacity import CapacityPlane, register_capacity
from tailguard.agents.control import SloBook
from tailguard.agents.experiment_actions import register_experiment_actions
from tailguard.agents.experiments import ExperimentsPlane, register_experiments
from tailguard.agents.folder import SeriesFolder
from tailguard.agents.gpu import GpuCache, register_gpu
from tailguard.agents.ingest import register_ingest
from tailguard.agents.interference import kv_forwarder, register_interference
from tailguard.agents.kv import declare_kv_table, register_kv
from tailguard.agents.otlp import OtlpStats, register_otlp
from tailguard.agents.outputs import Outputs
from tailguard.agents.prompts import PromptPlane, register_prompts
from tailguard.agents.requests import RequestBatch
from tailguard.agents.settings import Settings
from tailguard.agents.sli import register_sli
from tailguard.agents.state import SeriesStore
from tailguard.agents.stats import WorkerStats
from tailguard.agents.tables import Tables, declare_tables
from tailguard.agents.telemetry import Telemetry, activate
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
    #: What /metrics and /dashboard show (:mod:`tailguard.agents.telemetry`).
    telemetry: Telemetry | None = None
    #: Signed admin commands, audit trail, control state (:mod:`tailguard.agents.admin`).
    admin: AdminPlane | None = None
    #: The A/B and gray-release guard and its API (:mod:`tailguard.agents.experiments`).
    experiments: ExperimentsPlane | None = None
    #: Counters of the OTLP span ingest (:mod:`tailguard.agents.otlp`).
    otlp: OtlpStats | None = None
    #: Knee, scaling, warm-up, expert breakers, RAG threshold (:mod:`tailguard.agents.capacity`).
    capacity: CapacityPlane | None = None
    #: Prompt registry and groups (``prompts.group_of(version)``), per-group SLIs
    #: (:mod:`tailguard.agents.prompts`).
    prompts: PromptPlane | None = None


def build(settings: Settings) -> Pipeline:
    """A fully wired worker for ``settings`` (not started)."""
    app = make_app(settings)
    topics = declare_topics(app, settings)
    tables = declare_tables(app, settings)
    ring = RingConfig(allowed_lateness_ms=settings.allowed_lateness_ms)
    slos = load_slos(settings.slo_file) if settings.slo_file else default_slos()
    # The live SLOs: the admin plane changes them at run time (``slo set``).
    book = SloBook(slos)
    outputs = Outputs(settings.broker)
    writer = BulkWriter(outputs)
    store = SeriesStore(
        tables.series_meta,
        tables.series_buckets,
        ring,
        book.thresholds,
        writer=writer,
    )
    gpu_cache = GpuCache(settings.broker, topics.gpu.get_topic_name())
    engine = BreachEngine(
        slos=book.specs, state_table=tables.breach_state, gpu_table=gpu_cache, writer=writer
    )
    stats = WorkerStats()
    telemetry = activate(
        Telemetry(
            stats=stats,
            partitions=settings.partitions,
            max_series=settings.metrics_max_series,
            source=settings.source,
        )
    )
    engine.telemetry = telemetry
    if settings.web_enabled:
        from tailguard.agents.web import register_web

        register_web(app, telemetry)
    prompts = register_prompts(app, settings, stats, thresholds=book.thresholds)
    engine.prompt_group_of = prompts.group_of  # breaches name the groups of their prompts
    # The hallucination guardrail stratifies by prompt group (a version not in the
    # registry is its own stratum).
    experiments = register_experiments(app, topics, settings, stats, stratum_of=prompts.group_of)
    # Side consumers of the validated requests: the A/B guard and the per-group SLIs
    # (records of the requests naming an experiment or a prompt version), then the
    # capacity agent (every request's row; attached once outputs exist).
    capacity_hooks: list[Any] = []

    async def forward(batch: RequestBatch) -> None:
        named = batch.named_rows()
        if named:
            events, positions = batch.events(named), batch.positions(named)
            await experiments.forward(events, positions)
            await prompts.forward(events, positions)
        for hook in capacity_hooks:
            await hook(batch.capacity_groups())

    folder = SeriesFolder(app, topics, settings, stats, store, engine, outputs, telemetry=telemetry)
    register_ingest(app, topics, settings, stats, folder, forward)
    otlp = register_otlp(app, topics, settings, stats)
    register_gpu(app, topics, settings, stats, tables.gpu_latest)
    register_sli(app, topics, settings, folder)
    admin = register_admin(
        app, settings, book=book, engine=engine, store=store, tables=tables, outputs=outputs
    )
    # The experiment.* / release.rollback actions, over the stubs (answered by each owner).
    register_experiment_actions(admin.registry, experiments, settings, app=app, worker=admin.worker)
    capacity = register_capacity(
        app,
        settings,
        outputs=outputs,
        writer=writer,
        gpu_cache=gpu_cache,
        admin=admin,
        stats=stats,
    )
    capacity_hooks.append(capacity.forward)
    kv_table = declare_kv_table(app, settings)
    register_kv(app, topics, settings, stats, kv_table, kv_forwarder(topics, settings))
    register_interference(app, topics, settings, stats)

    async def persist_tables() -> None:
        # Last of the stopping hooks: what they stored is flushed to disk before the
        # data dir is marked clean (the bulk writer writes without RocksDB's log).
        writer.persist()

    app.stopping_hooks.append(persist_tables)  # type: ignore[attr-defined]

    @app.timer(settings.stats_interval_s, name="tailguard.stats")
    async def log_stats() -> None:
        app.log.info("tailguard %s", stats.line())

    return Pipeline(
        app,
        settings,
        topics,
        tables,
        store,
        engine,
        gpu_cache,
        stats,
        telemetry,
        admin=admin,
        experiments=experiments,
        otlp=otlp,
        capacity=capacity,
        prompts=prompts,
    )
