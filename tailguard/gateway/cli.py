"""``tailguard gateway`` and ``tailguard simulate-upstream``."""

import os
import sys
from pathlib import Path

import click

__all__ = ["gateway", "simulate_upstream"]


def _host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not port.isdigit():
        msg = f"--listen takes HOST:PORT, got {value!r}"
        raise click.BadParameter(msg)
    return host or "127.0.0.1", int(port)


@click.command("gateway")
@click.option("--upstream", required=True, help="Primary OpenAI-compatible upstream base URL.")
@click.option(
    "--upstream-canary",
    default=None,
    help="Canary upstream. Without --routes it gets --canary-weight of the units "
    "(experiment --canary-experiment, arms control / canary, layer canary).",
)
@click.option(
    "--upstream-extra",
    multiple=True,
    metavar="NAME=URL",
    help="More named upstreams that a routing file's arms may name (repeatable).",
)
@click.option(
    "--routes",
    "routes_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Experiments file with a routing: section (see tailguard/gateway/config.py).",
)
@click.option("--canary-experiment", default="canary", show_default=True)
@click.option("--canary-weight", type=float, default=0.1, show_default=True)
@click.option("--listen", default="127.0.0.1:8080", show_default=True, help="HOST:PORT.")
@click.option(
    "--broker",
    default=lambda: os.environ.get("TAILGUARD_BROKER", "localhost:9092"),
    show_default="env TAILGUARD_BROKER or localhost:9092",
)
@click.option(
    "--service",
    default="gateway",
    show_default=True,
    help="The events' service (a request may name its own: x-tailguard-service).",
)
@click.option(
    "--state-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Last release decision per experiment (default "
    "$TAILGUARD_STATE_DIR/gateway/<port>.json or .state/gateway/<port>.json).",
)
@click.option("--buffer-events", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option("--batch-events", type=click.IntRange(min=1), default=500, show_default=True)
@click.option("--linger-ms", type=click.FloatRange(min=0), default=50.0, show_default=True)
@click.option("--no-follow-releases", is_flag=True, help="Do not read tailguard.releases.")
@click.option("--read-timeout", type=float, default=300.0, show_default=True)
@click.option("--instance-id", default=None, help="Name of this gateway in audit records.")
@click.option(
    "--rating-rate",
    type=click.FloatRange(0.0, 1.0),
    default=0.0,
    show_default=True,
    help="Share of finished requests forwarded to tailguard.ratings for blind human rating "
    "(no experiment, arm or prompt version in them).",
)
@click.option("--loglevel", default="info", show_default=True)
def gateway(
    upstream: str,
    upstream_canary: str | None,
    upstream_extra: tuple[str, ...],
    routes_file: Path | None,
    canary_experiment: str,
    canary_weight: float,
    listen: str,
    broker: str,
    service: str,
    state_file: Path | None,
    buffer_events: int,
    batch_events: int,
    linger_ms: float,
    no_follow_releases: bool,
    read_timeout: float,
    instance_id: str | None,
    rating_rate: float,
    loglevel: str,
) -> None:
    """OpenAI-compatible streaming reverse proxy: measure every request into
    tailguard.inference, route experiments, obey tailguard.releases."""
    from tailguard.catalogue import default_prefix
    from tailguard.gateway.config import GatewayConfig, Routing, canary_routing, load_routing
    from tailguard.gateway.server import run_gateway

    host, port = _host_port(listen)
    upstreams = {"primary": upstream}
    if upstream_canary:
        upstreams["canary"] = upstream_canary
    for item in upstream_extra:
        name, _, url = item.partition("=")
        if not name or not url:
            msg = f"--upstream-extra takes NAME=URL, got {item!r}"
            raise click.BadParameter(msg)
        upstreams[name] = url
    if routes_file is not None:
        routing = load_routing(routes_file)
    elif upstream_canary:
        routing = canary_routing(canary_experiment, canary_weight)
    else:
        routing = Routing()
    if state_file is None:
        root = Path(os.environ.get("TAILGUARD_STATE_DIR", ".state"))
        state_file = root / "gateway" / f"{port}.json"
    extra: dict[str, object] = {}
    if instance_id:
        extra["instance_id"] = instance_id
    config = GatewayConfig(
        upstreams=upstreams,
        broker=broker,
        topic_prefix=default_prefix(),
        host=host,
        port=port,
        service=service,
        routing=routing,
        state_file=state_file,
        buffer_events=buffer_events,
        batch_events=batch_events,
        linger_ms=linger_ms,
        follow_releases=not no_follow_releases,
        upstream_read_timeout_s=read_timeout,
        rating_rate=rating_rate,
        **extra,  # type: ignore[arg-type]
    )
    sys.exit(run_gateway(config, loglevel=loglevel))


@click.command("simulate-upstream")
@click.option("--listen", default="127.0.0.1:9101", show_default=True, help="HOST:PORT.")
@click.option("--name", default="sim", show_default=True, help="Shown as system_fingerprint.")
@click.option("--ttft-ms", type=float, default=150.0, show_default=True)
@click.option(
    "--itl-ms", default="30", show_default=True, help="One gap or a comma list used in turn."
)
@click.option("--tokens", type=click.IntRange(min=1), default=32, show_default=True)
@click.option(
    "--jitter", type=float, default=0.0, show_default=True, help="Lognormal sigma on delays."
)
@click.option("--seed", type=int, default=None)
def simulate_upstream(
    listen: str,
    name: str,
    ttft_ms: float,
    itl_ms: str,
    tokens: int,
    jitter: float,
    seed: int | None,
) -> None:
    """A simulated OpenAI-compatible server that streams with known delays."""
    from tailguard.gateway.upstream import UpstreamProfile, run_upstream

    host, port = _host_port(listen)
    gaps = tuple(float(x) for x in itl_ms.split(",") if x.strip())
    profile = UpstreamProfile(name, ttft_ms, gaps or (30.0,), tokens, jitter, seed)
    run_upstream(profile, host, port)
