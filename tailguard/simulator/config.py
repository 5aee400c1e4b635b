"""Configuration of the traffic simulator: what traffic, for how long, which incidents.

Everything here is a frozen dataclass that validates itself in ``__post_init__``
and raises :class:`~tailguard.simulator.errors.SimConfigError` (a ``ValueError``)
with a message that names the field, the bad value and what is allowed.

The fleet the simulator pretends to serve::

    SimConfig
    ├── services: ServiceSpec("chat", models=(ModelSpec("llama-3.1-8b-instruct"), …))
    │             each model runs on ``instances`` serving instances of
    │             ``gpus_per_instance`` GPUs, packed onto 8-GPU hosts
    ├── tenants ("acme", "globex", "initech"), each with ``users_per_tenant`` stable users
    ├── experiment "exp-ttft-1" with variants ("control", "treatment"), users split by hash
    └── incidents: Incident(kind, start_s, end_s, Target(service=…, tenant=…), intensity)

Incident kinds and what ``intensity`` means for each (default in brackets):

===================  =========================================================  ========
kind                 effect on the matching requests                            intensity
===================  =========================================================  ========
``silent_collapse``  the article's chain: flow control at 128 tokens/s, prefix  share of matching
                     cache hit rate 98.7 % → 7.3 %, batching that waits for      requests hit [1.0]
                     ``min_batch=4`` up to 350 ms (+50 ms backoff): P95 TTFT
                     ~320 ms → ~1840 ms while status stays ``ok`` and QPS normal
``error_burst``      error / timeout / rejected statuses rise                    non-ok rate [0.15]
``noisy_neighbor``   the target tenant sends ``intensity`` x its usual load;     load factor [4.0]
                     everyone on the same service/model queues longer and
                     streams slower, and the KV cache of the instances it
                     reaches fragments (0.08 → 0.37 at 4x over 3 minutes; the
                     other tenants' P99 about doubles; see ``simulator.kv``)
                     (the target needs a ``tenant``)
``slow_treatment``   prefill (hence TTFT) of one variant is ``intensity`` x      TTFT factor [1.6]
                     slower; the variant defaults to the last one ("treatment")
``prompt_cache_miss`` a canary arm ships a new ``prompt_version`` ("v2"; the     share of matching
                     others say "v1") whose prefix no longer matches the        requests hit [1.0]
                     cached one: prefix-cache hit share ~ Beta(0.75, 9.5)
                     (mean 7.3 %), so prefill runs over ~93 % of the prompt
                     and TTFT rises; the variant defaults to the last one
===================  =========================================================  ========
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tailguard.simulator.errors import SimConfigError

__all__ = [
    "ARRIVAL_KINDS",
    "AZURE_TRACE_ATTRIBUTION",
    "DEFAULT_SERVICES",
    "DEFAULT_TENANTS",
    "DEFAULT_VARIANTS",
    "INCIDENT_DEFAULT_INTENSITY",
    "INCIDENT_KINDS",
    "TRACE_COLUMNS",
    "Incident",
    "ModelSpec",
    "ServiceSpec",
    "SimConfig",
    "Target",
]

ARRIVAL_KINDS: tuple[str, ...] = ("poisson", "bursty", "replay")
INCIDENT_KINDS: tuple[str, ...] = (
    "silent_collapse",
    "error_burst",
    "noisy_neighbor",
    "slow_treatment",
    "prompt_cache_miss",
)
INCIDENT_DEFAULT_INTENSITY: dict[str, float] = {
    "silent_collapse": 1.0,
    "error_burst": 0.15,
    "noisy_neighbor": 4.0,
    "slow_treatment": 1.6,
    "prompt_cache_miss": 1.0,
}
TRACE_COLUMNS: tuple[str, ...] = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
AZURE_TRACE_ATTRIBUTION = (
    "Azure LLM inference trace 2023 (CC-BY 4.0): Patel, Choukse, Zhang, Shah, Goiri, "
    'Maleki, Bianchini, "Splitwise: Efficient generative LLM inference using phase '
    'splitting", ISCA 2024.'
)

_TARGET_KEYS = ("service", "model", "tenant", "variant", "instance")


def _fail(msg: str) -> SimConfigError:
    return SimConfigError(msg)


def _finite_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        msg = f"{name} must be a number, got {value!r}"
        raise _fail(msg)
    if not math.isfinite(value):
        msg = f"{name} must be finite, got {value!r}"
        raise _fail(msg)
    return float(value)


def _positive(name: str, value: object) -> float:
    v = _finite_number(name, value)
    if v <= 0:
        msg = f"{name} must be > 0, got {value!r}"
        raise _fail(msg)
    return v


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{name} must be an integer >= 1, got {value!r}"
        raise _fail(msg)
    return value


def _names(name: str, values: object, *, allow_empty: bool = False) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, list | tuple):
        msg = f"{name} must be a list of names, got {values!r}"
        raise _fail(msg)
    out = tuple(values)
    if not out and not allow_empty:
        msg = f"{name} must not be empty"
        raise _fail(msg)
    for v in out:
        if not isinstance(v, str) or not v.strip() or v != v.strip():
            msg = f"{name} entries must be non-empty strings without surrounding spaces, got {v!r}"
            raise _fail(msg)
    dupes = sorted({v for v in out if out.count(v) > 1})
    if dupes:
        msg = f"{name} must be unique, duplicated: {', '.join(dupes)}"
        raise _fail(msg)
    return out


def _weights(name: str, values: object, n: int) -> tuple[float, ...]:
    if isinstance(values, str) or not isinstance(values, list | tuple):
        msg = f"{name} must be a list of {n} positive numbers, got {values!r}"
        raise _fail(msg)
    if len(values) != n:
        msg = f"{name} must have {n} entries (one per name), got {len(values)}"
        raise _fail(msg)
    return tuple(_positive(f"{name}[{i}]", w) for i, w in enumerate(values))


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model of a service and how fast it serves.

    ``itl_median_ms`` is the median gap between streamed tokens (25-35 ms is
    typical of a 7-70 B model on one H100-class node); ``ttft_scale``
    multiplies its prefill time; ``weight`` is its share of the service's
    traffic; the model runs on ``instances`` instances of
    ``gpus_per_instance`` GPUs each (tensor parallelism).
    """

    name: str
    weight: float = 1.0
    itl_median_ms: float = 30.0
    ttft_scale: float = 1.0
    instances: int = 2
    gpus_per_instance: int = 1

    def __post_init__(self) -> None:
        _names("model name", [self.name])
        where = f"model {self.name!r}"
        _positive(f"{where}: weight", self.weight)
        itl = _positive(f"{where}: itl_median_ms", self.itl_median_ms)
        if itl > 1000:
            msg = f"{where}: itl_median_ms must be <= 1000 ms, got {itl!r}"
            raise _fail(msg)
        _positive(f"{where}: ttft_scale", self.ttft_scale)
        _positive_int(f"{where}: instances", self.instances)
        gpus = _positive_int(f"{where}: gpus_per_instance", self.gpus_per_instance)
        if gpus > 8:
            msg = f"{where}: gpus_per_instance must be <= 8 (one host), got {gpus}"
            raise _fail(msg)


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """One service (an endpoint with its own prompt shapes) and its models.

    Prompt and completion sizes are lognormal with the given median and
    log-space sigma (the defaults follow the Azure conversation trace:
    median 1020 / P95 4083 context tokens, median 129 / P95 451 generated).
    ``models`` may be given as names; they become ``ModelSpec(name)``.
    """

    name: str
    models: tuple[ModelSpec, ...]
    weight: float = 1.0
    input_tokens_median: float = 1000.0
    input_tokens_sigma: float = 0.85
    output_tokens_median: float = 130.0
    output_tokens_sigma: float = 0.76

    def __post_init__(self) -> None:
        _names("service name", [self.name])
        where = f"service {self.name!r}"
        models = self.models
        if isinstance(models, str | ModelSpec) or not isinstance(models, list | tuple):
            msg = f"{where}: models must be a list of ModelSpec or names, got {models!r}"
            raise _fail(msg)
        if not models:
            msg = f"{where}: needs at least one model"
            raise _fail(msg)
        specs = tuple(m if isinstance(m, ModelSpec) else ModelSpec(name=m) for m in models)
        _names(f"{where}: model names", [m.name for m in specs])
        object.__setattr__(self, "models", specs)
        _positive(f"{where}: weight", self.weight)
        _positive(f"{where}: input_tokens_median", self.input_tokens_median)
        _positive(f"{where}: input_tokens_sigma", self.input_tokens_sigma)
        _positive(f"{where}: output_tokens_median", self.output_tokens_median)
        _positive(f"{where}: output_tokens_sigma", self.output_tokens_sigma)


@dataclass(frozen=True, slots=True)
class Target:
    """Which requests an incident hits; ``None`` fields match everything.

    ``Target()`` is "all". ``instance`` names look like ``chat-llama-3.1-8b-instruct-0``.
    """

    service: str | None = None
    model: str | None = None
    tenant: str | None = None
    variant: str | None = None
    instance: str | None = None

    def __post_init__(self) -> None:
        for key in _TARGET_KEYS:
            v = getattr(self, key)
            if v is not None and (not isinstance(v, str) or not v):
                msg = f"target {key} must be a non-empty string or None, got {v!r}"
                raise _fail(msg)

    @property
    def is_all(self) -> bool:
        """True when the target matches every request."""
        return all(getattr(self, k) is None for k in _TARGET_KEYS)

    def describe(self) -> str:
        """``"all"`` or ``"service=chat,tenant=acme"``."""
        parts = [f"{k}={getattr(self, k)}" for k in _TARGET_KEYS if getattr(self, k) is not None]
        return ",".join(parts) if parts else "all"


@dataclass(frozen=True, slots=True)
class Incident:
    """A degradation injected between ``start_s`` and ``end_s`` (seconds after the first arrival).

    ``intensity=None`` takes the kind's default (see the module docstring).
    """

    kind: str
    start_s: float
    end_s: float
    target: Target = field(default_factory=Target)
    intensity: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in INCIDENT_KINDS:
            msg = f"incident kind must be one of {', '.join(INCIDENT_KINDS)}, got {self.kind!r}"
            raise _fail(msg)
        start = _finite_number(f"{self.kind}: start_s", self.start_s)
        end = _finite_number(f"{self.kind}: end_s", self.end_s)
        if start < 0:
            msg = f"{self.kind}: start_s must be >= 0, got {start!r}"
            raise _fail(msg)
        if end <= start:
            msg = f"{self.kind}: end_s ({end!r}) must be greater than start_s ({start!r})"
            raise _fail(msg)
        if not isinstance(self.target, Target):
            msg = f"{self.kind}: target must be a Target, got {self.target!r}"
            raise _fail(msg)
        x = (
            INCIDENT_DEFAULT_INTENSITY[self.kind]
            if self.intensity is None
            else _finite_number(f"{self.kind}: intensity", self.intensity)
        )
        if self.kind in ("silent_collapse", "error_burst", "prompt_cache_miss") and not 0 < x <= 1:
            what = "non-ok rate" if self.kind == "error_burst" else "share of requests hit"
            msg = f"{self.kind}: intensity is the {what} and must be in (0, 1], got {x!r}"
            raise _fail(msg)
        if self.kind == "noisy_neighbor":
            if not 1 < x <= 100:
                msg = (
                    "noisy_neighbor: intensity is the noisy tenant's load multiplier "
                    f"and must be in (1, 100], got {x!r}"
                )
                raise _fail(msg)
            if self.target.tenant is None:
                msg = "noisy_neighbor: the target must name the noisy tenant (tenant=NAME)"
                raise _fail(msg)
        if self.kind == "slow_treatment" and not 0 < x <= 100:
            msg = f"slow_treatment: intensity is a TTFT factor in (0, 100], got {x!r}"
            raise _fail(msg)
        object.__setattr__(self, "start_s", start)
        object.__setattr__(self, "end_s", end)
        object.__setattr__(self, "intensity", x)

    @property
    def level(self) -> float:
        """The resolved intensity (never ``None`` after construction)."""
        assert self.intensity is not None
        return self.intensity

    @classmethod
    def parse(cls, text: str) -> Incident:
        """Parse the CLI form ``KIND:START_S:END_S[:FILTER]``.

        FILTER is ``all`` or comma-separated ``key=value`` pairs with keys
        ``service``, ``model``, ``tenant``, ``variant``, ``instance`` and
        ``intensity``; everything after the third colon is the filter, so
        model names may contain colons. Examples::

            silent_collapse:60:180:service=chat
            noisy_neighbor:0:120:tenant=acme,intensity=6
            error_burst:30:45
        """
        parts = text.strip().split(":", 3)
        if len(parts) < 3:
            msg = (
                f"incident {text!r} must look like KIND:START_S:END_S[:FILTER], "
                "e.g. silent_collapse:60:180:service=chat"
            )
            raise _fail(msg)
        kind, start_txt, end_txt = (p.strip() for p in parts[:3])
        try:
            start, end = float(start_txt), float(end_txt)
        except ValueError:
            msg = f"incident {text!r}: START_S and END_S must be numbers of seconds"
            raise _fail(msg) from None
        target: dict[str, str] = {}
        intensity: float | None = None
        filt = parts[3].strip() if len(parts) == 4 else ""
        if filt and filt != "all":
            for item in filt.split(","):
                key, sep, value = (s.strip() for s in item.partition("="))
                if not sep or not value:
                    msg = f"incident {text!r}: filter item {item!r} must be key=value"
                    raise _fail(msg)
                if key == "intensity":
                    try:
                        intensity = float(value)
                    except ValueError:
                        msg = f"incident {text!r}: intensity must be a number, got {value!r}"
                        raise _fail(msg) from None
                elif key in _TARGET_KEYS:
                    target[key] = value
                else:
                    allowed = ", ".join((*_TARGET_KEYS, "intensity"))
                    msg = f"incident {text!r}: unknown filter key {key!r} (allowed: {allowed})"
                    raise _fail(msg)
        return cls(
            kind=kind, start_s=start, end_s=end, target=Target(**target), intensity=intensity
        )


DEFAULT_SERVICES: tuple[ServiceSpec, ...] = (
    ServiceSpec(
        name="chat",
        weight=0.7,
        models=(
            ModelSpec("llama-3.1-8b-instruct", weight=0.6, itl_median_ms=25.0,
                      ttft_scale=0.92, instances=4, gpus_per_instance=1),
            ModelSpec("llama-3.1-70b-instruct", weight=0.4, itl_median_ms=34.0,
                      ttft_scale=1.12, instances=2, gpus_per_instance=4),
        ),
    ),
    ServiceSpec(
        name="search-rag",
        weight=0.3,
        input_tokens_median=2200.0,
        input_tokens_sigma=0.6,
        output_tokens_median=160.0,
        output_tokens_sigma=0.6,
        models=(
            ModelSpec("qwen2-7b-instruct", weight=1.0, itl_median_ms=28.0,
                      ttft_scale=1.0, instances=3, gpus_per_instance=1),
        ),
    ),
)  # fmt: skip
DEFAULT_TENANTS: tuple[str, ...] = ("acme", "globex", "initech")
DEFAULT_VARIANTS: tuple[str, ...] = ("control", "treatment")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class SimConfig:
    """What the simulator generates; validated on construction.

    Arrivals:

    - ``"poisson"``: a homogeneous Poisson process of ``rate`` requests/s.
    - ``"bursty"``: a 2-state Markov-modulated Poisson process (calm/burst).
      The burst state sends ``burst_factor`` x the calm rate, holds for an
      exponential time of mean ``burst_mean_s``, and takes
      ``burst_fraction`` of the time on average; the calm rate is chosen so
      the long-run mean rate is ``rate``.
    - ``"replay"``: arrival times and token counts from a CSV trace with
      columns ``TIMESTAMP,ContextTokens,GeneratedTokens`` (the Azure LLM
      inference trace 2023, CC-BY 4.0, Patel et al., "Splitwise", ISCA 2024),
      time-compressed by ``speedup`` and shifted to ``start_ms``; ``rate`` is
      ignored, ``duration_s=None`` replays the whole trace, and token counts
      of 0 are raised to 1 (every ``ok`` request streams a first token).

    ``start_ms`` is the event time of the first arrival (Unix epoch ms; default:
    now, resolved once at construction so the same config always yields the
    same events). ``tenant_weights`` default to Zipf (1, 1/2, 1/3, …).
    Sequences are stored as tuples. ``max_itl_gaps`` caps ``itl_ms`` (see
    :func:`tailguard.simulator.model.generate`); ``None`` keeps one gap per token.
    """

    rate: float = 50.0
    duration_s: float | None = 60.0
    seed: int = 0
    arrivals: str = "poisson"
    trace: str | Path | None = None
    speedup: float = 1.0
    services: Sequence[ServiceSpec] = DEFAULT_SERVICES
    tenants: Sequence[str] = DEFAULT_TENANTS
    tenant_weights: Sequence[float] | None = None
    variants: Sequence[str] = DEFAULT_VARIANTS
    experiment: str | None = "exp-ttft-1"
    start_ms: int | None = None
    incidents: Sequence[Incident] = ()
    users_per_tenant: int = 200
    burst_factor: float = 5.0
    burst_fraction: float = 0.1
    burst_mean_s: float = 5.0
    baseline_error_rate: float = 0.002
    request_timeout_ms: float = 30_000.0
    max_itl_gaps: int | None = None

    def __post_init__(self) -> None:
        self._check_arrivals()
        self._check_fleet()
        self._check_incidents()
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            msg = f"seed must be a non-negative integer, got {self.seed!r}"
            raise _fail(msg)
        start = self.start_ms
        if start is None:
            start = _now_ms()
        elif isinstance(start, bool) or not isinstance(start, int) or start < 0:
            msg = f"start_ms must be a non-negative integer (Unix epoch ms), got {start!r}"
            raise _fail(msg)
        object.__setattr__(self, "start_ms", start)
        _positive_int("users_per_tenant", self.users_per_tenant)
        rate = _finite_number("baseline_error_rate", self.baseline_error_rate)
        if not 0 <= rate < 1:
            msg = f"baseline_error_rate must be in [0, 1), got {rate!r}"
            raise _fail(msg)
        _positive("request_timeout_ms", self.request_timeout_ms)
        if self.max_itl_gaps is not None:
            _positive_int("max_itl_gaps", self.max_itl_gaps)

    # -- validation helpers -------------------------------------------------
    def _check_arrivals(self) -> None:
        if self.arrivals not in ARRIVAL_KINDS:
            msg = f"arrivals must be one of {', '.join(ARRIVAL_KINDS)}, got {self.arrivals!r}"
            raise _fail(msg)
        _positive("rate (requests/s)", self.rate)
        if self.duration_s is None:
            if self.arrivals != "replay":
                msg = f"duration_s is required for {self.arrivals} arrivals"
                raise _fail(msg)
        else:
            _positive("duration_s", self.duration_s)
        _positive("speedup", self.speedup)
        if self.arrivals == "replay":
            if self.trace is None:
                msg = (
                    "replay arrivals need trace=PATH to a CSV with columns "
                    f"{','.join(TRACE_COLUMNS)}"
                )
                raise _fail(msg)
            path = Path(self.trace)
            object.__setattr__(self, "trace", path)
            _check_trace_header(path)
        elif self.trace is not None:
            msg = f"trace is only used with arrivals='replay', not {self.arrivals!r}"
            raise _fail(msg)
        if self.arrivals == "bursty":
            factor = _positive("burst_factor", self.burst_factor)
            if factor < 1:
                msg = f"burst_factor must be >= 1 (burst rate / calm rate), got {factor!r}"
                raise _fail(msg)
            frac = _finite_number("burst_fraction", self.burst_fraction)
            if not 0 < frac < 1:
                msg = f"burst_fraction must be in (0, 1), got {frac!r}"
                raise _fail(msg)
            _positive("burst_mean_s", self.burst_mean_s)

    def _check_fleet(self) -> None:
        services = self.services
        if isinstance(services, ServiceSpec) or not isinstance(services, list | tuple):
            msg = f"services must be a list of ServiceSpec, got {services!r}"
            raise _fail(msg)
        if not services:
            msg = "services must not be empty"
            raise _fail(msg)
        for s in services:
            if not isinstance(s, ServiceSpec):
                msg = f"services entries must be ServiceSpec, got {s!r}"
                raise _fail(msg)
        _names("service names", [s.name for s in services])
        object.__setattr__(self, "services", tuple(services))
        object.__setattr__(self, "tenants", _names("tenants", self.tenants))
        if self.tenant_weights is not None:
            w = _weights("tenant_weights", self.tenant_weights, len(self.tenants))
            object.__setattr__(self, "tenant_weights", w)
        variants = _names("variants", self.variants, allow_empty=True)
        object.__setattr__(self, "variants", variants)
        if self.experiment is not None:
            _names("experiment", [self.experiment])
            if len(variants) < 2:
                msg = (
                    f"experiment {self.experiment!r} needs at least two variants, got "
                    f"{list(variants)!r} (set experiment=None for no experiment)"
                )
                raise _fail(msg)

    def _check_incidents(self) -> None:
        incidents = self.incidents
        if isinstance(incidents, Incident) or not isinstance(incidents, list | tuple):
            msg = f"incidents must be a list of Incident, got {incidents!r}"
            raise _fail(msg)
        resolved: list[Incident] = []
        for inc in incidents:
            if not isinstance(inc, Incident):
                msg = f"incidents entries must be Incident, got {inc!r}"
                raise _fail(msg)
            if inc.kind in ("slow_treatment", "prompt_cache_miss") and inc.target.variant is None:
                if not self.variants:
                    msg = f"{inc.kind} needs variants (there is no treatment to slow down)"
                    raise _fail(msg)
                inc = replace(inc, target=replace(inc.target, variant=self.variants[-1]))
            self._check_target(inc)
            resolved.append(inc)
        object.__setattr__(self, "incidents", tuple(resolved))

    def _check_target(self, inc: Incident) -> None:
        t = inc.target
        known: dict[str, Sequence[str]] = {
            "service": tuple(s.name for s in self.services),
            "model": tuple(dict.fromkeys(m.name for s in self.services for m in s.models)),
            "tenant": self.tenants,
            "variant": self.variants or ("default",),
            "instance": tuple(name for name, _, _ in self.instance_layout()),
        }
        for key, names in known.items():
            value = getattr(t, key)
            if value is not None and value not in names:
                msg = (
                    f"{inc.kind}: target {key} {value!r} does not exist (known: {', '.join(names)})"
                )
                raise _fail(msg)
        if t.service is not None and t.model is not None:
            svc = next(s for s in self.services if s.name == t.service)
            if t.model not in {m.name for m in svc.models}:
                msg = f"{inc.kind}: service {t.service!r} has no model {t.model!r}"
                raise _fail(msg)

    # -- derived facts ------------------------------------------------------
    @property
    def first_ms(self) -> int:
        """``start_ms`` resolved (never ``None`` after construction)."""
        assert self.start_ms is not None
        return self.start_ms

    def instance_layout(self) -> list[tuple[str, str, list[int]]]:
        """Every serving instance as ``(instance, host, gpu_ids)``, in fleet order.

        Instances are named ``{service}-{model}-{i}`` and packed in order onto
        8-GPU hosts ``gpu-node-01``, ``gpu-node-02``, … (an instance never
        spans two hosts).
        """
        out: list[tuple[str, str, list[int]]] = []
        host, used = 1, 0
        for svc in self.services:
            for m in svc.models:
                for i in range(m.instances):
                    if used + m.gpus_per_instance > 8:
                        host, used = host + 1, 0
                    gpus = list(range(used, used + m.gpus_per_instance))
                    used += m.gpus_per_instance
                    out.append((f"{svc.name}-{m.name}-{i}", f"gpu-node-{host:02d}", gpus))
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly summary (for logs and the CLI banner)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "services":
                v = {s.name: [m.name for m in s.models] for s in v}
            elif f.name == "incidents":
                v = [
                    f"{i.kind}:{i.start_s:g}:{i.end_s:g}:{i.target.describe()}"
                    f" (intensity {i.level:g})"
                    for i in v
                ]
            elif isinstance(v, Path):
                v = str(v)
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out


def _check_trace_header(path: Path) -> None:
    if not path.is_file():
        msg = f"trace file {str(path)!r} does not exist or is not a file"
        raise _fail(msg)
    with path.open(newline="", encoding="utf-8") as fh:
        header = next(csv.reader(fh), [])
    missing = [c for c in TRACE_COLUMNS if c not in [h.strip() for h in header]]
    if missing:
        msg = (
            f"trace {str(path)!r} lacks column(s) {', '.join(missing)}; a replay trace "
            f"needs a header with {','.join(TRACE_COLUMNS)}"
        )
        raise _fail(msg)
