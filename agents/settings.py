"""Worker settings: one dataclass, read from flags and ``TAILGUARD_*`` environment variables."""

import os
from dataclasses import dataclass, field
from pathlib import Path

from tailguard.agents.cadence import CheckpointCadence
from tailguard.agents.errors import SettingsError

from tailguard.catalogue import default_partitions, default_prefix

__all__ = ["Settings"]

_MIB = 1024 * 1024
#: Integer settings read from the environment as they are (memory sizing,
#: docs/performance.md).
_INT_ENV = {
    "ingest_batch": "TAILGUARD_INGEST_BATCH",
    "rocksdb_cache_mib": "TAILGUARD_ROCKSDB_CACHE_MIB",
    "rocksdb_write_buffer_mib": "TAILGUARD_ROCKSDB_WRITE_BUFFER_MIB",
    "rocksdb_write_buffers": "TAILGUARD_ROCKSDB_WRITE_BUFFERS",
}


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a worker needs to know.

    RocksDB is sized for the 2-core, 24 GiB build machines: faust's
    default of a 2 GiB block cache *per partition and table* would ask for far
    more memory than exists, so each partition store gets ``rocksdb_cache_mib``.
    """

    broker: str = "localhost:9092"
    app_id: str = "tailguard"
    data_dir: Path = Path(".state/worker")
    partitions: int = 4
    #: Namespace prefix of every topic (empty: the contract's names).
    topic_prefix: str = ""
    #: Windows published on ``tailguard.sli`` (names from ``tailguard.streams.WINDOWS``).
    sli_windows: tuple[str, ...] = ("1m", "5m", "1h")
    #: Wall-clock period of provisional snapshots of series that changed (0: off).
    snapshot_interval_s: float = 10.0
    allowed_lateness_ms: int = 120_000
    #: A series fed by several input partitions waits for the slowest of them;
    #: one that has brought it nothing for this long (wall time) is no longer waited for.
    feeder_idle_s: float = 60.0
    #: Ingest batching: forward per-series batches every ``ingest_batch`` messages or
    #: ``ingest_within_s`` seconds, whichever comes first — or once no message has
    #: come for ``ingest_idle_s`` (the input is caught up: waiting on only delays
    #: what the batch closes, such as a minute's final snapshots).
    ingest_batch: int = 500
    #: The ingest applies the requests of deployments whose capacity partition is
    #: here itself (False: every request goes through the internal topic, the
    #: capacity agent's path for deployments of other workers).
    capacity_in_place: bool = True
    ingest_within_s: float = 0.5
    ingest_idle_s: float = 0.05
    #: Wall-clock period of state checkpoints per partition: changed series are
    #: written to the tables and the input they hold is acknowledged (so the
    #: consumer offset never runs ahead of the stored state).
    checkpoint_interval_s: float = 5.0
    #: Most of the SLI agent's time checkpoints may take: with many busy series a
    #: checkpoint takes seconds, and the period then stretches to keep within this
    #: share (:class:`~tailguard.agents.cadence.CheckpointCadence`) ...
    checkpoint_max_share: float = 0.2
    #: ... up to this period (or ``checkpoint_interval_s`` if that is longer): the
    #: most input a crash makes the worker replay.
    checkpoint_max_interval_s: float = 30.0
    #: Period of the worker's one-line counters in its log.
    stats_interval_s: float = 30.0
    #: RocksDB per store (one per table and partition): block cache, memtable
    #: size and memtables kept in memory (RSS ≤ stores × buffer × buffers + caches).
    rocksdb_cache_mib: int = 16
    rocksdb_write_buffer_mib: int = 4
    rocksdb_write_buffers: int = 2
    web_port: int = 6066
    web_enabled: bool = False
    #: Address the web server (/metrics, /dashboard) listens on.
    web_bind: str = "127.0.0.1"
    #: Series exported with their own labels on /metrics and the dashboard
    #: (bounded cardinality, :mod:`tailguard.agents.telemetry`).
    metrics_max_series: int = 100
    attach_digests: bool = False
    #: OpenSLO v1 YAML with the SLOs to hold series to (default: ``schemas/slos/defaults.yaml``).
    slo_file: Path | None = None
    #: Admin keys file (YAML/JSON: key_id → role, secret or secret_env); without
    #: one every admin command is refused (:mod:`tailguard.admin.keys`).
    admin_keys_file: Path | None = None
    #: YAML files of experiments the A/B guard watches (:mod:`tailguard.schemas.experiments`).
    experiments_files: tuple[Path, ...] = ()
    source: str = field(default_factory=lambda: f"tailguard/{os.uname().nodename}")

    def __post_init__(self) -> None:
        from tailguard.streams import WINDOWS

        unknown = [w for w in self.sli_windows if w not in WINDOWS]
        if unknown:
            msg = f"unknown SLI window(s) {unknown}; choose from {sorted(WINDOWS)}"
            raise SettingsError(msg)
        if self.partitions < 1:
            msg = f"partitions must be ≥ 1, got {self.partitions}"
            raise SettingsError(msg)
        try:
            self.checkpoint_cadence()
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        if self.metrics_max_series < 0:
            msg = f"metrics_max_series must be ≥ 0, got {self.metrics_max_series}"
            raise SettingsError(msg)
        if self.rocksdb_cache_mib < 1 or self.rocksdb_write_buffer_mib < 1:
            msg = "rocksdb_cache_mib and rocksdb_write_buffer_mib must be ≥ 1"
            raise SettingsError(msg)
        if self.rocksdb_write_buffers < 2:
            n = self.rocksdb_write_buffers
            msg = f"rocksdb_write_buffers must be ≥ 2 (one filling, one flushing), got {n}"
            raise SettingsError(msg)
        if self.feeder_idle_s <= 0:
            msg = f"feeder_idle_s must be > 0, got {self.feeder_idle_s}"
            raise SettingsError(msg)
        if self.ingest_batch < 1 or not 0 < self.ingest_idle_s <= self.ingest_within_s:
            got = (self.ingest_batch, self.ingest_idle_s, self.ingest_within_s)
            msg = f"ingest_batch must be ≥ 1 and 0 < ingest_idle_s ≤ ingest_within_s, got {got}"
            raise SettingsError(msg)

    def checkpoint_cadence(self) -> CheckpointCadence:
        """A fresh :class:`CheckpointCadence` from the three ``checkpoint_*`` settings."""
        return CheckpointCadence(
            self.checkpoint_interval_s,
            max_share=self.checkpoint_max_share,
            max_interval_s=self.checkpoint_max_interval_s,
        )

    @classmethod
    def from_env(cls, **overrides: object) -> "Settings":
        """Defaults, then ``TAILGUARD_*`` variables, then explicit overrides (flags)."""
        env = os.environ
        values: dict[str, object] = {
            "broker": env.get("TAILGUARD_BROKER", "localhost:9092"),
            "app_id": env.get("TAILGUARD_APP_ID", "tailguard"),
            "data_dir": Path(env.get("TAILGUARD_DATA_DIR", ".state/worker")),
            "partitions": default_partitions(),
            "topic_prefix": default_prefix(),
        }
        if env.get("TAILGUARD_STATS_INTERVAL_S"):
            values["stats_interval_s"] = float(env["TAILGUARD_STATS_INTERVAL_S"])
        if env.get("TAILGUARD_CHECKPOINT_S"):
            values["checkpoint_interval_s"] = float(env["TAILGUARD_CHECKPOINT_S"])
        if env.get("TAILGUARD_CHECKPOINT_SHARE"):
            values["checkpoint_max_share"] = float(env["TAILGUARD_CHECKPOINT_SHARE"])
        if env.get("TAILGUARD_CHECKPOINT_MAX_S"):
            values["checkpoint_max_interval_s"] = float(env["TAILGUARD_CHECKPOINT_MAX_S"])
        if env.get("TAILGUARD_INGEST_IDLE_S"):
            values["ingest_idle_s"] = float(env["TAILGUARD_INGEST_IDLE_S"])
        if env.get("TAILGUARD_FEEDER_IDLE_S"):
            values["feeder_idle_s"] = float(env["TAILGUARD_FEEDER_IDLE_S"])
        if env.get("TAILGUARD_CAPACITY_IN_PLACE"):
            values["capacity_in_place"] = env["TAILGUARD_CAPACITY_IN_PLACE"] not in {"0", "false"}
        if env.get("TAILGUARD_WEB_PORT"):
            values["web_port"] = int(env["TAILGUARD_WEB_PORT"])
            values["web_enabled"] = True
        if env.get("TAILGUARD_WEB_BIND"):
            values["web_bind"] = env["TAILGUARD_WEB_BIND"]
        if env.get("TAILGUARD_METRICS_MAX_SERIES"):
            values["metrics_max_series"] = int(env["TAILGUARD_METRICS_MAX_SERIES"])
        for name, var in _INT_ENV.items():
            if env.get(var):
                values[name] = int(env[var])
        values.update({k: v for k, v in overrides.items() if v is not None})
        if isinstance(values["data_dir"], str):
            values["data_dir"] = Path(values["data_dir"])
        if "slo_file" not in values and env.get("TAILGUARD_SLO_FILE"):
            values["slo_file"] = Path(env["TAILGUARD_SLO_FILE"])
        if "admin_keys_file" not in values and env.get("TAILGUARD_ADMIN_KEYS"):
            values["admin_keys_file"] = Path(env["TAILGUARD_ADMIN_KEYS"])
        if "experiments_files" not in values and env.get("TAILGUARD_EXPERIMENTS_FILE"):
            names = env["TAILGUARD_EXPERIMENTS_FILE"].split(os.pathsep)
            values["experiments_files"] = tuple(Path(n) for n in names if n)
        if isinstance(values.get("admin_keys_file"), str):
            values["admin_keys_file"] = Path(values["admin_keys_file"])
        return cls(**values)  # type: ignore[arg-type]

    def rocksdb_options(self) -> dict[str, object]:
        """Per-partition RocksDB options passed to every table."""
        return {
            "driver": "rocksdict",
            "block_cache_size": self.rocksdb_cache_mib * _MIB,
            "block_cache_compressed_size": 0,
            "write_buffer_size": self.rocksdb_write_buffer_mib * _MIB,
            "max_write_buffer_number": self.rocksdb_write_buffers,
            "target_file_size_base": 16 * _MIB,
            "max_open_files": 256,
        }
