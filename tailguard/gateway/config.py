"""Gateway settings and the routing file.

The routing file *is* an experiments file (the A/B guard's format,
:mod:`tailguard.streams.experiment_def`, loaded by
:func:`tailguard.schemas.experiments.parse_experiments`: arms, weights, control,
unit), plus a top-level ``routing:`` section that only the gateway reads — so
``tailguard worker --experiments-file F`` and ``tailguard gateway --routes F``
take the same file and agree on arms and weights::

    apiVersion: tailguard/v1
    kind: Experiments
    experiments:
      - id: canary-v2
        arms: [{name: control, weight: 0.9}, {name: canary, weight: 0.1}]
        guardrails: {ttft_p95: {max_ratio: 1.10}}
    routing:
      unit_header: x-tailguard-unit     # the randomisation unit; else the body's "user"
      layers:
        release: {salt: release-1}      # optional; the salt defaults to the layer name
      experiments:
        canary-v2:                      # only experiments listed here are routed
          layer: release                # default "default"
          traffic: 1.0                  # share of the layer's units (default 1)
          arms:
            control: {upstream: primary, prompt_version: v1}
            canary: {upstream: canary, prompt_version: v2}

An experiment whose ``unit`` is ``session_id`` is randomised by the session
header instead. Upstream names: ``primary`` (``--upstream``), ``canary``
(``--upstream-canary``) and any ``--upstream-extra NAME=URL``.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tailguard.gateway.errors import RoutingConfigError
from tailguard.gateway.routing import PRIMARY, ArmRoute, ExperimentRoute, Layer, Router

__all__ = [
    "DEFAULT_SESSION_HEADER",
    "DEFAULT_TENANT_HEADER",
    "DEFAULT_UNIT_HEADER",
    "GatewayConfig",
    "Routing",
    "canary_routing",
    "load_routing",
    "parse_routing",
]

DEFAULT_UNIT_HEADER = "x-tailguard-unit"
DEFAULT_SESSION_HEADER = "x-tailguard-session"
DEFAULT_TENANT_HEADER = "x-tailguard-tenant"


@dataclass(frozen=True, slots=True)
class Routing:
    """The router and how a request names its unit."""

    router: Router = field(default_factory=Router)
    unit_header: str = DEFAULT_UNIT_HEADER


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Everything one gateway process needs."""

    upstreams: Mapping[str, str]
    broker: str = "localhost:9092"
    topic_prefix: str = ""
    host: str = "127.0.0.1"
    port: int = 8080
    service: str = "gateway"
    routing: Routing = field(default_factory=Routing)
    state_file: Path = Path(".state/gateway/state.json")
    #: Events held while the broker is away (oldest dropped past it, counted).
    buffer_events: int = 100_000
    #: Events per Kafka message (a JSON array) and the longest an event waits.
    batch_events: int = 500
    linger_ms: float = 50.0
    follow_releases: bool = True
    upstream_connect_timeout_s: float = 10.0
    upstream_read_timeout_s: float = 300.0
    #: Who this gateway is, in events (``instance``) and audit records.
    instance_id: str = field(default_factory=lambda: f"gateway@{os.uname().nodename}")
    source: str = field(default_factory=lambda: f"tailguard-gateway/{os.uname().nodename}")
    session_header: str = DEFAULT_SESSION_HEADER
    tenant_header: str = DEFAULT_TENANT_HEADER
    #: Share of finished requests forwarded for blind human rating (tailguard.ratings).
    rating_rate: float = 0.0

    def __post_init__(self) -> None:
        if PRIMARY not in self.upstreams:
            msg = "the gateway needs a primary upstream (--upstream URL)"
            raise RoutingConfigError(msg)
        missing = self.routing.router.upstreams() - set(self.upstreams)
        if missing:
            msg = (
                f"the routing refers to upstream(s) {sorted(missing)} that are not configured "
                f"(known: {sorted(self.upstreams)}); add --upstream-canary URL or "
                "--upstream-extra NAME=URL"
            )
            raise RoutingConfigError(msg)
        if not 0.0 <= self.rating_rate <= 1.0:
            msg = f"rating_rate must be in [0, 1], got {self.rating_rate}"
            raise RoutingConfigError(msg)
        if self.buffer_events < 1 or self.batch_events < 1 or self.linger_ms < 0:
            msg = "buffer_events and batch_events must be ≥ 1 and linger_ms ≥ 0"
            raise RoutingConfigError(msg)


def canary_routing(experiment: str = "canary", weight: float = 0.1) -> Routing:
    """The routing of ``--upstream-canary`` without a routing file: one experiment,
    arms ``control`` (primary upstream) and ``canary`` (canary upstream)."""
    if not 0.0 < weight < 1.0:
        msg = f"--canary-weight must be in (0, 1), got {weight}"
        raise RoutingConfigError(msg)
    exp = ExperimentRoute(
        experiment,
        (ArmRoute("control", 1.0 - weight, PRIMARY), ArmRoute("canary", weight, "canary")),
        "control",
    )
    return Routing(Router((Layer("canary", (exp,)),)))


def load_routing(path: str | os.PathLike[str]) -> Routing:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"{p}: cannot read the routing file: {exc.strerror or exc}"
        raise RoutingConfigError(msg) from exc
    return parse_routing(text, str(p))


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        msg = f"{where} must be a mapping, got {type(value).__name__}"
        raise RoutingConfigError(msg)
    return value


def parse_routing(text: str, name: str = "<string>") -> Routing:
    """The routing of an experiments file with a ``routing:`` section."""
    from tailguard.schemas.experiments import ExperimentConfigError, parse_experiments

    try:
        definitions = parse_experiments(text, name)
    except ExperimentConfigError as exc:
        raise RoutingConfigError(str(exc)) from exc
    data = yaml.safe_load(text)
    section = _mapping(data.get("routing"), f"{name}: routing")
    known = {"unit_header", "layers", "experiments"}
    unknown = sorted(set(section) - known)
    if unknown:
        msg = f"{name}: routing: unknown key(s) {unknown}; known: {sorted(known)}"
        raise RoutingConfigError(msg)
    unit_header = str(section.get("unit_header") or DEFAULT_UNIT_HEADER).lower()
    salts = {
        str(k): str(_mapping(v, f"{name}: routing.layers.{k}").get("salt") or k)
        for k, v in _mapping(section.get("layers"), f"{name}: routing.layers").items()
    }
    grouped: dict[str, list[ExperimentRoute]] = {}
    for exp_id, raw in _mapping(section.get("experiments"), f"{name}: routing.experiments").items():
        where = f"{name}: routing.experiments.{exp_id}"
        spec = _mapping(raw, where)
        bad = sorted(set(spec) - {"layer", "traffic", "arms"})
        if bad:
            msg = f"{where}: unknown key(s) {bad}; known: arms, layer, traffic"
            raise RoutingConfigError(msg)
        defn = definitions.get(str(exp_id))
        if defn is None:
            msg = f"{where}: no experiment {exp_id!r} in the experiments list of this file"
            raise RoutingConfigError(msg)
        arm_specs = _mapping(spec.get("arms"), f"{where}.arms")
        extra = sorted(set(arm_specs) - set(defn.arm_names))
        if extra:
            msg = f"{where}.arms: {extra} are not arms of {exp_id} ({', '.join(defn.arm_names)})"
            raise RoutingConfigError(msg)
        arms = []
        for arm in defn.arms:
            a = _mapping(arm_specs.get(arm.name), f"{where}.arms.{arm.name}")
            bad = sorted(set(a) - {"upstream", "prompt_version"})
            if bad:
                msg = (
                    f"{where}.arms.{arm.name}: unknown key(s) {bad}; "
                    "known: upstream, prompt_version"
                )
                raise RoutingConfigError(msg)
            upstream = a.get("upstream")
            version = a.get("prompt_version")
            arms.append(
                ArmRoute(
                    arm.name,
                    arm.weight,
                    None if upstream is None else str(upstream),
                    None if version is None else str(version),
                )
            )
        traffic = spec.get("traffic", 1.0)
        if isinstance(traffic, bool) or not isinstance(traffic, int | float):
            msg = f"{where}.traffic must be a number in (0, 1], got {traffic!r}"
            raise RoutingConfigError(msg)
        try:
            route = ExperimentRoute(
                defn.id, tuple(arms), defn.control, float(traffic), unit=defn.unit
            )
        except RoutingConfigError as exc:
            raise RoutingConfigError(f"{where}: {exc}") from exc
        layer = str(spec.get("layer") or "default")
        grouped.setdefault(layer, []).append(route)
    try:
        layers = tuple(Layer(k, tuple(v), salts.get(k, k)) for k, v in grouped.items())
        router = Router(layers)
    except RoutingConfigError as exc:
        raise RoutingConfigError(f"{name}: routing: {exc}") from exc
    return Routing(router, unit_header)
