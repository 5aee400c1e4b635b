"""``tailguard simulate``: realistic LLM inference traffic into Kafka (or stdout).

The lead attaches :data:`simulate` to the main ``tailguard`` group; it also
runs alone (``python -m tailguard.simulator.cli --help``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import click
import msgspec

from tailguard.simulator.arrivals import load_trace
from tailguard.simulator.config import (
    ARRIVAL_KINDS,
    AZURE_TRACE_ATTRIBUTION,
    INCIDENT_KINDS,
    Incident,
    SimConfig,
)
from tailguard.simulator.errors import SimConfigError, SimulatorError
from tailguard.simulator.kv import DEFAULT_KV_INTERVAL_S, KvTracker
from tailguard.simulator.model import generate
from tailguard.simulator.producer import INFERENCE_TOPIC, KV_TOPIC, PACES, Pace, Stats, run

__all__ = ["simulate"]

_CREDIT = AZURE_TRACE_ATTRIBUTION.replace(": Patel", ":\n  Patel").replace(
    ', "Splitwise', ',\n  "Splitwise'
)
_HELP = f"""Generate realistic LLM inference events (tailguard.inference.v1) and send them
to Kafka, as JSON arrays of up to --batch-size events keyed "service/model".

\b
Arrivals: poisson (--rate req/s), bursty (2-state MMPP with the same mean rate)
or replay of a CSV trace with columns TIMESTAMP,ContextTokens,GeneratedTokens
(--trace; e.g. the Azure LLM inference trace, time-compressed by --speedup).

\b
Replay data credit: {_CREDIT}

\b
--incident KIND:START_S:END_S[:FILTER], repeatable; seconds after the start.
KIND: {", ".join(INCIDENT_KINDS)}.
FILTER: "all" or key=value pairs joined by commas, keys service, model,
tenant, variant, instance and intensity.

\b
--kv also sends every serving instance's KV-cache snapshot (tailguard.kv.v1)
every --kv-interval seconds of event time; a noisy_neighbor incident raises
the fragmentation of the instances it reaches from 0.08 towards 0.37.

\b
Examples:
  tailguard simulate --rate 50 --duration 300 \\
      --incident silent_collapse:60:240:service=chat
  tailguard simulate --rate 20 --duration 3600 --kv --pace max \\
      --incident noisy_neighbor:1800:3000:tenant=acme,model=llama-3.1-8b-instruct
  tailguard simulate --trace AzureLLMInferenceTrace_conv.csv --speedup 10 --pace max
  tailguard simulate --dry-run 5 --incident noisy_neighbor:0:30:tenant=acme,intensity=6
"""


def _parse_incidents(values: Sequence[str]) -> tuple[Incident, ...]:
    out = []
    for text in values:
        try:
            out.append(Incident.parse(text))
        except SimConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="--incident") from None
    return tuple(out)


def _progress(duration_s: float | None) -> Any:
    last = [0.0]

    def show(stats: Stats) -> None:
        now = time.monotonic()
        if now - last[0] < 5.0:
            return
        last[0] = now
        of = f"/{duration_s:g}" if duration_s else ""
        failed = f", {stats.failed_messages} failed" if stats.failed_messages else ""
        click.echo(
            f"[{stats.elapsed_s:6.1f}{of} s] sent {stats.events} events in "
            f"{stats.messages} messages ({stats.delivered_messages} delivered{failed})",
            err=True,
        )

    return show


@click.command("simulate", help=_HELP)
@click.option(
    "--broker",
    envvar="TAILGUARD_BROKER",
    default="localhost:9092",
    show_default=True,
    help="Kafka bootstrap servers (env TAILGUARD_BROKER).",
)
@click.option(
    "--rate",
    type=float,
    default=50.0,
    show_default=True,
    help="Mean arrival rate, requests/s (poisson, bursty).",
)
@click.option(
    "--duration",
    type=float,
    default=None,
    help="Seconds of event time [default: 60; replay: the whole trace].",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option(
    "--arrivals",
    type=click.Choice(ARRIVAL_KINDS),
    default=None,
    help="Arrival process [default: replay with --trace, else poisson].",
)
@click.option(
    "--trace",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Trace CSV for replay (TIMESTAMP,ContextTokens,GeneratedTokens).",
)
@click.option(
    "--speedup",
    type=float,
    default=1.0,
    show_default=True,
    help="Replay time compression: 10 plays a 10-minute trace in 1 minute.",
)
@click.option(
    "--pace",
    type=click.Choice(PACES),
    default="realtime",
    show_default=True,
    help="realtime: send at event time (ts = wall clock); max: as fast as possible.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="Events per Kafka message (one service/model per message).",
)
@click.option(
    "--incident",
    "incidents",
    multiple=True,
    metavar="KIND:START_S:END_S[:FILTER]",
    help="Inject an incident (repeatable).",
)
@click.option("--topic", default=INFERENCE_TOPIC, show_default=True, help="Target topic.")
@click.option(
    "--experiment",
    default="exp-ttft-1",
    show_default=True,
    help="Experiment id on every event (users split by hash over control/treatment).",
)
@click.option(
    "--kv", "kv", is_flag=True, help="Also send KV-cache snapshots per instance (--kv-topic)."
)
@click.option("--kv-topic", default=KV_TOPIC, show_default=True, help="Topic of the KV snapshots.")
@click.option(
    "--kv-interval",
    type=click.FloatRange(min=0.1),
    default=DEFAULT_KV_INTERVAL_S,
    show_default=True,
    help="Seconds of event time between two snapshots of an instance.",
)
@click.option(
    "--start-ms",
    type=click.IntRange(min=0),
    default=None,
    help="Event time of the first arrival, epoch ms [default: now; with --pace max, "
    "now minus the run's span so no event lies in the future].",
)
@click.option(
    "--dry-run",
    type=click.IntRange(min=0),
    is_flag=False,
    flag_value=10,
    default=None,
    metavar="[N]",
    help="Print the first N events (default 10; 0 = all) as JSON "
    "lines to stdout instead of sending them.",
)
@click.option(
    "--connect-timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds to wait for the broker before giving up.",
)
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
def simulate(
    broker: str,
    rate: float,
    duration: float | None,
    seed: int,
    arrivals: str | None,
    trace: Path | None,
    speedup: float,
    pace: str,
    batch_size: int,
    incidents: tuple[str, ...],
    topic: str,
    experiment: str,
    kv: bool,
    kv_topic: str,
    kv_interval: float,
    start_ms: int | None,
    dry_run: int | None,
    connect_timeout: float,
    quiet: bool,
) -> None:
    """The ``simulate`` command (help text above)."""
    kind = arrivals or ("replay" if trace is not None else "poisson")
    if duration is None and kind != "replay":
        duration = 60.0
    if start_ms is None and pace == "max" and dry_run is None:
        start_ms = time.time_ns() // 1_000_000 - int(1000 * _span_s(kind, duration, trace, speedup))
    try:
        cfg = SimConfig(
            rate=rate,
            duration_s=duration,
            seed=seed,
            arrivals=kind,
            trace=trace,
            speedup=speedup,
            start_ms=start_ms,
            incidents=_parse_incidents(incidents),
            experiment=experiment,
        )
    except SimConfigError as exc:
        raise click.UsageError(str(exc)) from None

    if dry_run is not None:
        _print_events(cfg, dry_run, kv_interval if kv else None)
        return

    if not quiet:
        click.echo(
            f"simulating {kind} traffic to {broker} topic {topic} (pace {pace}, seed {seed})"
            + "".join(f"\n  incident {i}" for i in cfg.to_dict()["incidents"]),
            err=True,
        )
    try:
        stats = run(
            cfg,
            broker=broker,
            topic=topic,
            batch_size=batch_size,
            pace=cast(Pace, pace),
            on_progress=None if quiet else _progress(duration),
            connect_timeout_s=connect_timeout,
            kv_topic=kv_topic if kv else None,
            kv_interval_s=kv_interval,
        )
    except (SimulatorError, SimConfigError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(msgspec.json.encode(stats.to_dict()).decode())
    if stats.failed_messages:
        msg = f"{stats.failed_messages} message(s) were not delivered: {stats.last_error}"
        raise click.ClickException(msg)
    if stats.interrupted:
        sys.exit(130)


def _span_s(kind: str, duration: float | None, trace: Path | None, speedup: float) -> float:
    if kind != "replay" or trace is None:
        return duration or 0.0
    try:
        span = load_trace(trace).span_s / speedup if speedup > 0 else 0.0
    except SimConfigError as exc:
        raise click.UsageError(str(exc)) from None
    return span if duration is None else min(duration, span)


def _print_events(cfg: SimConfig, limit: int, kv_interval_s: float | None) -> None:
    """The first ``limit`` records (0: all); with ``kv_interval_s``, KV snapshots
    are interleaved with the events in event time."""
    encoder = msgspec.json.Encoder()
    out = sys.stdout.buffer
    tracker = KvTracker(cfg, interval_s=kv_interval_s) if kv_interval_s is not None else None
    events = generate(cfg) if tracker is None else tracker.watch(generate(cfg))
    printed = 0
    for ev in events:
        records = [] if tracker is None else tracker.due()
        for record in [*records, ev]:
            if limit and printed >= limit:
                out.flush()
                return
            out.write(encoder.encode(record) + b"\n")
            printed += 1
    for record in [] if tracker is None else tracker.finish():
        if limit and printed >= limit:
            break
        out.write(encoder.encode(record) + b"\n")
        printed += 1
    out.flush()


if __name__ == "__main__":  # pragma: no cover
    simulate()
