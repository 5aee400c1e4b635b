"""``tailguard gpu-sampler``: NVML (or simulated) GPU telemetry into ``tailguard.gpu``.

The lead attaches :data:`gpu_sampler` to the main ``tailguard`` group; it also
runs alone (``python -m tailguard.gpu.cli --help``).

Exit status: 0 done (``--count`` reached, or stopped by SIGINT/SIGTERM);
1 the sampler failed (broker unreachable, samples not delivered, every GPU
lost); 2 bad usage; 3 no NVIDIA driver or GPU on this machine (one line on
stderr that starts with ``error: no NVIDIA``); 130 interrupted while starting.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

import click

from tailguard.gpu.errors import GpuConfigError, GpuSamplerError, NoGpuTelemetry
from tailguard.gpu.nvml import NvmlReader
from tailguard.gpu.reader import GpuReader
from tailguard.gpu.sampler import GPU_TOPIC, JsonLinesProducer, SamplerStats, default_topic, run
from tailguard.gpu.simulate import Pressure, SimulatedReader, XidEvent

__all__ = ["EXIT_FAILED", "EXIT_NO_GPU", "gpu_sampler"]

T = TypeVar("T")

EXIT_FAILED = 1
EXIT_NO_GPU = 3

_HELP = """Sample every NVIDIA GPU of this host through NVML once per --interval and
send one tailguard.gpu.v1 record per GPU to Kafka (key "host:gpu", CloudEvents
headers), or print them as JSON lines (--print).

\b
Without a GPU, --simulate makes plausible telemetry for a fleet of H100s
(default: gpu-node-01 and gpu-node-02, 8 GPUs each, the hosts `tailguard
simulate` places its instances on):
  --pressure HOST:START_S:END_S   high load, memory near full, power and
                                  thermal throttling, rising temperature
                                  (HOST "*" = every host; seconds from start)
  --xid HOST:GPU:AT_S[:CODE]      an XID error (default code 94)

\b
Examples:
  tailguard gpu-sampler --interval 1
  tailguard gpu-sampler --simulate --pressure gpu-node-01:60:240
  tailguard gpu-sampler --simulate --hosts 4 --print --count 3
"""


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _hosts(text: str) -> int | list[str]:
    text = text.strip()
    if text.isdigit():
        return int(text)
    return [h.strip() for h in text.split(",") if h.strip()]


def _specs(values: Sequence[str], parse: Callable[[str], T], hint: str) -> list[T]:
    out: list[T] = []
    for text in values:
        try:
            out.append(parse(text))
        except GpuConfigError as exc:
            raise click.BadParameter(str(exc), param_hint=hint) from None
    return out


def _log_to_stderr() -> None:
    """Show the sampler's warnings (GPU lost, XID, delivery failures) unless the app logs."""
    log = logging.getLogger("tailguard.gpu")
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.WARNING)


def _reader(
    simulate: bool,
    host: str | None,
    hosts: str | None,
    gpus_per_host: int | None,
    seed: int | None,
    pressure: Sequence[str],
    xids: Sequence[str],
) -> GpuReader:
    if not simulate:
        extra = [
            flag
            for flag, value in (
                ("--hosts", hosts),
                ("--gpus-per-host", gpus_per_host),
                ("--seed", seed),
                ("--pressure", pressure or None),
                ("--xid", xids or None),
            )
            if value is not None
        ]
        if extra:
            msg = f"{', '.join(extra)} only apply with --simulate"
            raise click.UsageError(msg)
        return NvmlReader(host)
    try:
        return SimulatedReader(
            hosts=_hosts(hosts or "2"),
            gpus_per_host=8 if gpus_per_host is None else gpus_per_host,
            seed=0 if seed is None else seed,
            pressure=_specs(pressure, Pressure.parse, "--pressure"),
            xids=_specs(xids, XidEvent.parse, "--xid"),
        )
    except GpuConfigError as exc:
        raise click.UsageError(str(exc)) from None


@click.command("gpu-sampler", help=_HELP)
@click.option(
    "--broker",
    default=lambda: os.environ.get("TAILGUARD_BROKER", "localhost:9092"),
    show_default="env TAILGUARD_BROKER or localhost:9092",
    help="Kafka bootstrap servers.",
)
@click.option(
    "--topic",
    default=None,
    help=f"Target topic [default: env TAILGUARD_TOPIC_PREFIX + {GPU_TOPIC}].",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.01),
    default=1.0,
    show_default=True,
    help="Seconds between samples.",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after N rounds [default: run until SIGINT/SIGTERM].",
)
@click.option(
    "--print",
    "print_",
    is_flag=True,
    help="Write the records as JSON lines to stdout instead of Kafka.",
)
@click.option(
    "--host",
    default=None,
    help="Host name in the records [default: this machine's name]; with --simulate, "
    "the name in CloudEvents ce_source.",
)
@click.option("--simulate", is_flag=True, help="Simulated telemetry instead of NVML.")
@click.option(
    "--hosts",
    default=None,
    metavar="N|NAME,…",
    help="Simulated hosts: a count (gpu-node-01, …) or names [default: 2].",
)
@click.option(
    "--gpus-per-host",
    type=click.IntRange(1, 64),
    default=None,
    help="Simulated GPUs per host [default: 8].",
)
@click.option("--seed", type=int, default=None, help="Simulation seed [default: 0].")
@click.option(
    "--pressure",
    multiple=True,
    metavar="HOST:START_S:END_S",
    help="Simulated pressure episode (repeatable).",
)
@click.option(
    "--xid",
    "xids",
    multiple=True,
    metavar="HOST:GPU:AT_S[:CODE]",
    help="Simulated XID error (repeatable).",
)
@click.option(
    "--connect-timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds to wait for the broker before giving up.",
)
@click.option("--quiet", is_flag=True, help="No summary line on stderr.")
def gpu_sampler(
    broker: str,
    topic: str | None,
    interval: float,
    count: int | None,
    print_: bool,
    host: str | None,
    simulate: bool,
    hosts: str | None,
    gpus_per_host: int | None,
    seed: int | None,
    pressure: tuple[str, ...],
    xids: tuple[str, ...],
    connect_timeout: float,
    quiet: bool,
) -> None:
    """The ``gpu-sampler`` command (help text above)."""
    _log_to_stderr()
    topic = topic or default_topic()
    try:
        reader = _reader(simulate, host, hosts, gpus_per_host, seed, pressure, xids)
    except NoGpuTelemetry as exc:
        _fail(str(exc), EXIT_NO_GPU)
    except GpuSamplerError as exc:
        _fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt:
        sys.exit(130)

    with reader:
        try:
            stats = run(
                reader,
                broker=broker,
                topic=topic,
                interval_s=interval,
                host=host or socket.gethostname(),
                count=count,
                producer=JsonLinesProducer(sys.stdout.buffer) if print_ else None,
                connect_timeout_s=connect_timeout,
            )
        except GpuSamplerError as exc:
            _fail(str(exc), EXIT_FAILED)
        except BrokenPipeError:  # `--print | head`: the reader of stdout left
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return
    if not quiet and not print_:
        click.echo(_summary(stats, broker, topic), err=True)
    if stats.failed or stats.dropped:
        _fail(
            f"{stats.failed + stats.dropped} sample(s) were not delivered: {stats.last_error}",
            EXIT_FAILED,
        )


def _summary(stats: SamplerStats, broker: str, topic: str) -> str:
    stopped = f", stopped by {stats.stopped_by}" if stats.stopped_by else ""
    return (
        f"sent {stats.samples} GPU samples in {stats.rounds} rounds to {topic} on {broker} "
        f"({stats.delivered} delivered{stopped})"
    )


if __name__ == "__main__":  # pragma: no cover
    gpu_sampler()
