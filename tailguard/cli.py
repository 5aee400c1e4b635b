"""The ``tailguard`` command.

::

    tailguard worker              run a worker (ingest + SLI agents)
    tailguard simulate …          realistic LLM traffic into tailguard.inference
    tailguard gpu-sampler         NVML telemetry into tailguard.gpu (--simulate for demos)
    tailguard topics create       create every topic of the catalogue
    tailguard topics list         show the catalogue
    tailguard tail TOPIC          follow a topic, pretty-printed
    tailguard watch               live table of SLIs per series
    tailguard report              SLI and breach summary, time × stage P99 heatmaps
    tailguard admin …             sign and send an admin command, print its reply
    tailguard alerts follow       breaches and release decisions as they arrive
    tailguard alerts forward      … to an Alertmanager-compatible webhook (commit after delivery)
    tailguard gateway --upstream URL [--upstream-canary URL]
                                  OpenAI-compatible proxy: measures requests, routes experiments
    tailguard simulate-upstream   a simulated OpenAI-compatible server with known delays
    tailguard prompts add FILE    register a prompt version in tailguard.prompts
    tailguard prompts list        registered versions with their prompt groups

Operators get one-line errors, not tracebacks: every ``TailguardError`` is
printed with what to do and exits with status 2.
"""

import os
import sys
from pathlib import Path

import click

from tailguard.errors import TailguardError

__all__ = ["main"]

_BROKER = click.option(
    "--broker",
    default=lambda: os.environ.get("TAILGUARD_BROKER", "localhost:9092"),
    show_default="env TAILGUARD_BROKER or localhost:9092",
    help="Kafka bootstrap servers.",
)


@click.group()
@click.version_option(package_name="tailguard")
def cli() -> None:
    """tailguard: keep LLM serving inside its latency SLOs."""


@cli.command()
@_BROKER
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Worker state directory (env TAILGUARD_DATA_DIR, default .state/worker).",
)
@click.option("--partitions", type=int, default=None, help="Partitions of the data topics.")
@click.option(
    "--snapshot-interval",
    type=float,
    default=None,
    help="Seconds between provisional SLI snapshots (0: off).",
)
@click.option("--windows", default=None, help="Comma-separated SLI windows, e.g. 1m,5m,1h.")
@click.option("--lateness-ms", type=int, default=None, help="Allowed lateness in event time.")
@click.option(
    "--checkpoint-interval",
    type=float,
    default=None,
    help="Seconds between state checkpoints per partition (env TAILGUARD_CHECKPOINT_S, "
    "default 5). Stretched, up to TAILGUARD_CHECKPOINT_MAX_S (default 30), while "
    "checkpoints would take more than TAILGUARD_CHECKPOINT_SHARE (default 0.2) of the "
    "SLI agent's time; the longest period is the most input replayed after a crash.",
)
@click.option(
    "--slo-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="OpenSLO v1 YAML (env TAILGUARD_SLO_FILE; default: built-in SLOs).",
)
@click.option(
    "--web-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve /metrics (Prometheus) and /dashboard (live page) on this port "
    "(env TAILGUARD_WEB_PORT; default: no web server).",
)
@click.option(
    "--web-bind",
    default=None,
    help="Address of the web server (env TAILGUARD_WEB_BIND, default 127.0.0.1).",
)
@click.option(
    "--admin-keys",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Admin keys file (env TAILGUARD_ADMIN_KEYS): key ids, roles and secrets that may "
    "sign commands on tailguard.admin; without it every command is refused.",
)
@click.option(
    "--experiments-file",
    "experiments_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML experiments for the A/B guard (repeatable; env TAILGUARD_EXPERIMENTS_FILE, "
    "paths joined by ':'), e.g. infra/experiments/canary.yaml.",
)
@click.option("--loglevel", default="info", show_default=True)
def worker(
    broker: str,
    data_dir: Path | None,
    partitions: int | None,
    snapshot_interval: float | None,
    windows: str | None,
    lateness_ms: int | None,
    checkpoint_interval: float | None,
    slo_file: Path | None,
    web_port: int | None,
    web_bind: str | None,
    admin_keys: Path | None,
    experiments_files: tuple[Path, ...],
    loglevel: str,
) -> None:
    """Run a worker: validate input, keep sliding windows, publish SLIs."""
    from tailguard.agents.settings import Settings
    from tailguard.agents.worker import run_worker
    from tailguard.kafka_admin import ensure_broker

    ensure_broker(broker)
    settings = Settings.from_env(
        broker=broker,
        data_dir=data_dir,
        partitions=partitions,
        snapshot_interval_s=snapshot_interval,
        sli_windows=tuple(windows.split(",")) if windows else None,
        allowed_lateness_ms=lateness_ms,
        checkpoint_interval_s=checkpoint_interval,
        slo_file=slo_file,
        web_port=web_port,
        web_enabled=True if web_port is not None else None,
        web_bind=web_bind,
        admin_keys_file=admin_keys,
        experiments_files=experiments_files or None,
    )
    if settings.experiments_files:
        from tailguard.schemas.experiments import load_experiments

        for path in settings.experiments_files:
            load_experiments(path)  # a bad file fails here, with its line, not in the worker
    if settings.admin_keys_file is not None:
        from tailguard.admin.keys import load_keyring

        load_keyring(settings.admin_keys_file)  # a bad keys file fails here, not in the worker
    if settings.slo_file is not None:
        from tailguard.schemas.openslo import load_slos

        load_slos(settings.slo_file)  # a bad file fails here, with its line, not in the worker
    sys.exit(run_worker(settings, loglevel=loglevel))


@cli.group()
def topics() -> None:
    """Kafka topics of the catalogue."""


@topics.command("create")
@_BROKER
@click.option("--partitions", type=int, default=None, help="Partitions of the data topics.")
def topics_create(broker: str, partitions: int | None) -> None:
    """Create every topic of the catalogue that does not exist (idempotent)."""
    from tailguard.catalogue import catalogue
    from tailguard.kafka_admin import create_topics

    report = create_topics(broker, catalogue(partitions))
    click.echo(f"created {len(report.created)} topic(s), {len(report.existing)} already existed")
    for name in report.created:
        click.echo(f"  + {name}")


@topics.command("list")
def topics_list() -> None:
    """Print the catalogue."""
    from tailguard.catalogue import catalogue

    for spec in catalogue():
        pol = "compact" if spec.compact else "delete"
        kept = f"{spec.retention_ms // 3_600_000}h" if spec.retention_ms >= 0 else "forever"
        click.echo(
            f"{spec.name:28} p={spec.partitions:<3} retention={kept} {pol:8} {spec.description}"
        )


@cli.command()
@_BROKER
@click.argument("topic")
@click.option("--from-beginning", is_flag=True, help="Start at the oldest record.")
@click.option("-n", "--limit", type=int, default=None, help="Stop after N records.")
def tail(broker: str, topic: str, from_beginning: bool, limit: int | None) -> None:
    """Follow TOPIC, pretty-printing each JSON record."""
    from tailguard.console import tail as run_tail

    run_tail(broker, topic, from_beginning=from_beginning, limit=limit)


@cli.command()
@_BROKER
@click.option("--window", default="1m", show_default=True)
@click.option("--duration", type=float, default=None, help="Stop after this many seconds.")
def watch(broker: str, window: str, duration: float | None) -> None:
    """Live table of the newest SLI snapshot per series."""
    from tailguard.console import watch_sli

    watch_sli(broker, window=window, duration_s=duration)


@cli.command()
@_BROKER
@click.option("--window", default="1m", show_default=True, help="SLI window to report on.")
@click.option(
    "--idle",
    type=float,
    default=5.0,
    show_default=True,
    help="Give up on a topic after this many seconds without a record before its end offsets.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, writable=True, path_type=Path),
    default=Path("tailguard-report"),
    show_default=True,
    help="Folder for heatmap-<series>.png, index.html and heatmap.json.",
)
@click.option(
    "--series",
    "series",
    multiple=True,
    metavar="PATTERN",
    help="Only series whose service/model/variant/tenant matches this glob (or contains "
    "this text); repeatable.",
)
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Draw at most this many series: those whose stage P99 grew most.",
)
@click.option(
    "--last",
    type=click.IntRange(min=1),
    default=None,
    help="Heatmap time axis: only the last N windows of each series (default: all).",
)
def report(
    broker: str,
    window: str,
    idle: float,
    out_dir: Path,
    series: tuple[str, ...],
    top: int,
    last: int | None,
) -> None:
    """Summarise the final SLI snapshots per series and every breach transition, then write
    a time × stage P99 heatmap per series (PNG, index.html, heatmap.json) into --out."""
    from tailguard.console import heatmap_report

    heatmap_report(
        broker, out_dir=out_dir, idle_s=idle, window=window, series=series, top=top, last=last
    )


def _attach_plugins() -> None:
    from tailguard.admin.cli import admin
    from tailguard.alerts.cli import alerts
    from tailguard.gateway.cli import gateway, simulate_upstream
    from tailguard.gpu.cli import gpu_sampler
    from tailguard.prompts import prompts
    from tailguard.simulator.cli import simulate

    cli.add_command(simulate, "simulate")
    cli.add_command(admin, "admin")
    cli.add_command(gpu_sampler, "gpu-sampler")
    cli.add_command(alerts, "alerts")
    cli.add_command(gateway, "gateway")
    cli.add_command(simulate_upstream, "simulate-upstream")
    cli.add_command(prompts, "prompts")


def main() -> None:
    """Entry point: run the CLI, turning tailguard errors into one clear line."""
    _attach_plugins()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except TailguardError as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
