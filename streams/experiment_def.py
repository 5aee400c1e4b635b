"""What an experiment is: arms with planned weights, guardrails, minimum samples.

A definition is a frozen dataclass that validates itself and round-trips
through a plain mapping (:meth:`ExperimentDef.from_mapping` /
:meth:`ExperimentDef.to_mapping`), the form it has in YAML
(``infra/experiments/*.yaml``, loaded by the schemas package's ``experiments`` module)
and in the admin API::

    id: canary-prompt-v2
    unit: unit_id                      # randomisation unit: unit_id | session_id
    arms:                              # planned traffic weights (normalised)
      - {name: control, weight: 0.5}   # the first arm is the control unless control: NAME
      - {name: treatment, weight: 0.5}
    guardrails:                        # metric: {constraint: limit, ...}
      ttft_p95: {max_ratio: 1.10}      #   treatment P95 ≤ 1.10 × control P95
      itl_p99: {max_ratio: 1.10}
      e2e_p95: {max_ratio: 1.15}
      success_rate: {min: 0.992}       #   absolute: treatment ≥ 99.2 %
      interruption_rate: {max_diff: 0.02}    # at most +2 points over control
      session_completion: {min_diff: -0.02}  # at most −2 points
      hallucination_rate: {max_diff: 0.02}   # human feedback: at most +2 points
    min_samples: {units: 1000, requests: 2000, sessions: 200, ratings: 200}   # per arm
    rating_looks: 6                    # hallucination_rate: tested at ratings × 1, 2, 4 … 32
    alpha: 0.01                        # family-wise error of the guardrail decisions
    srm_alpha: 0.001

Metrics: ``{ttft|itl|e2e}_p{50|90|95|99|999}`` (latency quantiles; ``itl`` is the
per-token gap), ``success_rate``, ``interruption_rate`` (IR: share of ended
sessions the user interrupted mid-stream), ``session_completion`` (SC: share
of ended sessions completed), ``hallucination_rate`` (share of rated requests
that a human rater labelled ``hallucination``; ``max_diff`` is judged by a
stratified permutation test at fixed information milestones, see
:mod:`tailguard.streams.experiment`). Constraints: ``max_ratio`` / ``min_ratio``
(treatment ÷ control), ``max_diff`` / ``min_diff`` (treatment − control) and
``max`` / ``min`` (the treatment's own level). A constraint whose direction
does not fit the metric's "bad" direction (``min_ratio`` on a latency) is
refused: a guardrail guards against getting worse.

*Bad request* (the release decision's prompt evidence, :attr:`ExperimentDef.bad_ttft_ms`):
an ``error`` / ``timeout`` / ``rejected`` request, or an ``ok`` one whose TTFT is
over the experiment's absolute TTFT limit — the smallest ``max`` of a
``ttft_pXX`` guardrail — or, without one, over the default TTFT SLO threshold
(800 ms). Cancelled requests are never bad (the user left).
"""

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tailguard.streams.errors import ConfigError
from tailguard.streams.sli import Thresholds

__all__ = [
    "CONSTRAINTS",
    "PROPORTION_METRICS",
    "QUANTILE_SOURCES",
    "Arm",
    "ExperimentDef",
    "Guardrail",
    "MinSamples",
    "metric_kind",
]

QUANTILE_SOURCES = ("ttft", "itl", "e2e")
#: proportion metric → (its "bad" direction, the sample it counts)
PROPORTION_METRICS: dict[str, tuple[str, str]] = {
    "success_rate": ("down", "requests"),
    "interruption_rate": ("up", "sessions"),
    "session_completion": ("down", "sessions"),
    "hallucination_rate": ("up", "ratings"),
}
#: constraint key → (kind, bound)
CONSTRAINTS: dict[str, tuple[str, str]] = {
    "max_ratio": ("ratio", "max"),
    "min_ratio": ("ratio", "min"),
    "max_diff": ("diff", "max"),
    "min_diff": ("diff", "min"),
    "max": ("level", "max"),
    "min": ("level", "min"),
}
_QUANTILE = re.compile(r"^(ttft|itl|e2e)_p(\d{2,3})$")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
UNITS = ("unit_id", "session_id")


def metric_kind(metric: str) -> tuple[str, str, float | None]:
    """``(kind, bad direction, quantile level)`` of a metric name; ConfigError if unknown.

    ``kind`` is ``"quantile"`` or ``"proportion"``.
    """
    m = _QUANTILE.match(metric)
    if m:
        digits = m.group(2)
        q = int(digits) / (10 ** len(digits))
        if not 0.0 < q < 1.0:
            msg = f"metric {metric!r}: quantile must be in (0, 1)"
            raise ConfigError(msg)
        return "quantile", "up", q
    if metric in PROPORTION_METRICS:
        return "proportion", PROPORTION_METRICS[metric][0], None
    known = ", ".join([f"{s}_p95" for s in QUANTILE_SOURCES] + list(PROPORTION_METRICS))
    msg = f"unknown guardrail metric {metric!r} (e.g. {known}; quantiles p50, p90, p99, p999 too)"
    raise ConfigError(msg)


@dataclass(frozen=True, slots=True)
class Guardrail:
    """One constraint on one metric of every treatment arm.

    ``kind``: ``ratio`` (treatment ÷ control), ``diff`` (treatment − control) or
    ``level`` (the treatment alone); ``bound``: the limit is a ``max`` or a ``min``.
    """

    metric: str
    kind: Literal["ratio", "diff", "level"]
    bound: Literal["max", "min"]
    limit: float

    def __post_init__(self) -> None:
        kind, bad, _ = metric_kind(self.metric)
        if self.kind not in ("ratio", "diff", "level") or self.bound not in ("max", "min"):
            msg = f"guardrail {self.metric}: bad kind/bound {self.kind}/{self.bound}"
            raise ConfigError(msg)
        if not isinstance(self.limit, int | float) or not math.isfinite(self.limit):
            msg = f"guardrail {self.metric}: limit must be a finite number, got {self.limit!r}"
            raise ConfigError(msg)
        if (bad == "up") != (self.bound == "max"):
            want = "max_*" if bad == "up" else "min_*"
            msg = (
                f"guardrail {self.metric}: {self.key} guards the wrong side; {self.metric} gets "
                f"worse going {bad}, so use a {want} constraint"
            )
            raise ConfigError(msg)
        if self.kind == "ratio" and self.limit <= 0:
            msg = f"guardrail {self.metric}: {self.key} must be > 0, got {self.limit}"
            raise ConfigError(msg)
        if kind == "proportion" and self.kind == "level" and not 0.0 <= self.limit <= 1.0:
            msg = f"guardrail {self.metric}: {self.key} is a share in [0, 1], got {self.limit}"
            raise ConfigError(msg)

    @property
    def key(self) -> str:
        return self.bound if self.kind == "level" else f"{self.bound}_{self.kind}"

    @property
    def name(self) -> str:
        """``ttft_p95.max_ratio``: unique within an experiment."""
        return f"{self.metric}.{self.key}"

    def describe(self) -> str:
        op = "≤" if self.bound == "max" else "≥"
        if self.kind == "ratio":
            return f"{self.metric} treatment/control {op} {self.limit:g}"
        if self.kind == "diff":
            return f"{self.metric} treatment−control {op} {self.limit:+g}"
        return f"{self.metric} {op} {self.limit:g}"


@dataclass(frozen=True, slots=True)
class Arm:
    name: str
    weight: float


@dataclass(frozen=True, slots=True)
class MinSamples:
    """Per-arm minimum sample sizes before a metric may decide anything."""

    units: int = 0
    requests: int = 1000
    sessions: int = 200
    #: Rated requests (human feedback) per arm before hallucination_rate is first tested.
    ratings: int = 200

    def __post_init__(self) -> None:
        for name in ("units", "requests", "sessions", "ratings"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                msg = f"min_samples.{name} must be an integer >= 0, got {v!r}"
                raise ConfigError(msg)


DEFAULT_GUARDRAILS: tuple[Guardrail, ...] = (
    Guardrail("ttft_p95", "ratio", "max", 1.10),
    Guardrail("itl_p99", "ratio", "max", 1.10),
    Guardrail("e2e_p95", "ratio", "max", 1.10),
    Guardrail("success_rate", "level", "min", 0.992),
    Guardrail("interruption_rate", "diff", "max", 0.02),
    Guardrail("session_completion", "diff", "min", -0.02),
)


@dataclass(frozen=True, slots=True)
class ExperimentDef:
    """An experiment (or gray release) the guard watches; validated on construction."""

    id: str
    arms: tuple[Arm, ...]
    control: str = ""
    unit: str = "unit_id"
    guardrails: tuple[Guardrail, ...] = DEFAULT_GUARDRAILS
    min_samples: MinSamples = field(default_factory=MinSamples)
    #: Family-wise error rate of the guardrail decisions (rollback and promote).
    alpha: float = 0.01
    #: SRM alarm level (both the chi-square and the sequential p-value must be below).
    srm_alpha: float = 0.001
    #: A cause flag whose rate differs by at least this much between arms
    #: (and significantly) marks the experiment polluted.
    pollution_min_diff: float = 0.05
    #: Relative gain of an offline score that counts as "improves" (misalignment).
    eval_min_gain: float = 0.01
    #: Offline metrics where lower is better (everything else: higher is better).
    evals_lower_is_better: tuple[str, ...] = ("perplexity", "wer", "cer", "ter")
    #: Event-time period of evaluations.
    evaluate_every_ms: int = 60_000
    #: Looks of the hallucination_rate permutation test: at min_samples.ratings × 2^k
    #: rated requests per arm, k = 0 … rating_looks − 1 (its alpha split over them).
    rating_looks: int = 6
    #: Events before this time (epoch ms) are ignored; None: from the first event.
    start_ms: int | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _ID.match(self.id):
            msg = f"experiment id must match {_ID.pattern}, got {self.id!r}"
            raise ConfigError(msg)
        where = f"experiment {self.id}"
        if self.unit not in UNITS:
            msg = f"{where}: unit must be one of {', '.join(UNITS)}, got {self.unit!r}"
            raise ConfigError(msg)
        arms = tuple(self.arms)
        if len(arms) < 2:
            msg = f"{where}: needs at least two arms (a control and a treatment)"
            raise ConfigError(msg)
        names = [a.name for a in arms]
        if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            msg = f"{where}: arm names must be unique non-empty strings, got {names}"
            raise ConfigError(msg)
        for a in arms:
            if not isinstance(a.weight, int | float) or not (
                math.isfinite(a.weight) and a.weight > 0
            ):
                msg = f"{where}: arm {a.name} weight must be > 0, got {a.weight!r}"
                raise ConfigError(msg)
        control = self.control or names[0]
        if control not in names:
            msg = f"{where}: control {control!r} is not an arm ({', '.join(names)})"
            raise ConfigError(msg)
        object.__setattr__(self, "control", control)
        object.__setattr__(self, "arms", arms)
        rails = tuple(self.guardrails)
        seen = [g.name for g in rails]
        if len(set(seen)) != len(seen):
            msg = f"{where}: a guardrail constraint is given twice: {seen}"
            raise ConfigError(msg)
        object.__setattr__(self, "guardrails", rails)
        for name, lo, hi in (("alpha", 0.0, 0.5), ("srm_alpha", 0.0, 0.5)):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not lo < v < hi:
                msg = f"{where}: {name} must be in ({lo}, {hi}), got {v!r}"
                raise ConfigError(msg)
        if not 0.0 <= self.pollution_min_diff < 1.0:
            msg = f"{where}: pollution_min_diff must be in [0, 1), got {self.pollution_min_diff}"
            raise ConfigError(msg)
        if self.eval_min_gain < 0:
            msg = f"{where}: eval_min_gain must be >= 0, got {self.eval_min_gain}"
            raise ConfigError(msg)
        if (
            isinstance(self.evaluate_every_ms, bool)
            or not isinstance(self.evaluate_every_ms, int)
            or not 1_000 <= self.evaluate_every_ms <= 3_600_000
        ):
            msg = f"{where}: evaluate_every_s must be between 1 and 3600 s"
            raise ConfigError(msg)
        object.__setattr__(self, "evals_lower_is_better", tuple(self.evals_lower_is_better))
        if (
            isinstance(self.rating_looks, bool)
            or not isinstance(self.rating_looks, int)
            or not 1 <= self.rating_looks <= 20
        ):
            msg = f"{where}: rating_looks must be an integer in [1, 20], got {self.rating_looks!r}"
            raise ConfigError(msg)

    # -- derived ----------------------------------------------------------
    @property
    def arm_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.arms)

    @property
    def treatments(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.arms if a.name != self.control)

    @property
    def weights(self) -> dict[str, float]:
        """Planned weights, normalised to sum 1."""
        total = sum(a.weight for a in self.arms)
        return {a.name: a.weight / total for a in self.arms}

    @property
    def bad_ttft_ms(self) -> float:
        """TTFT over which an ``ok`` request counts as bad in the prompt evidence: the
        smallest absolute limit (``max``) of a ``ttft_pXX`` guardrail, else the default
        TTFT SLO threshold (800 ms)."""
        limits = [
            g.limit
            for g in self.guardrails
            if g.metric.startswith("ttft_") and g.kind == "level" and g.bound == "max"
        ]
        return min(limits) if limits else Thresholds().ttft_ms

    @property
    def test_alpha(self) -> float:
        """Level of one guardrail comparison (Bonferroni over guardrails × treatments)."""
        return self.alpha / (max(1, len(self.guardrails)) * len(self.treatments))

    # -- mappings ---------------------------------------------------------
    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "ExperimentDef":
        """Build from the YAML/admin form (see the module docstring)."""
        if not isinstance(data, Mapping):
            msg = f"an experiment must be a mapping, got {type(data).__name__}"
            raise ConfigError(msg)
        known = {
            "id", "unit", "arms", "control", "guardrails", "min_samples", "alpha", "srm_alpha",
            "pollution_min_diff", "eval_min_gain", "evals_lower_is_better", "evaluate_every_s",
            "start_ms", "description", "rating_looks",
        }  # fmt: skip
        unknown = sorted(set(data) - known)
        exp_id = data.get("id")
        where = f"experiment {exp_id!r}"
        if unknown:
            msg = f"{where}: unknown key(s) {unknown}; known: {sorted(known)}"
            raise ConfigError(msg)
        raw_arms = data.get("arms")
        if not isinstance(raw_arms, list) or not raw_arms:
            msg = f"{where}: arms must be a list of {{name, weight}}"
            raise ConfigError(msg)
        arms = []
        for i, a in enumerate(raw_arms):
            if isinstance(a, str):
                arms.append(Arm(a, 1.0))
                continue
            if not isinstance(a, Mapping) or "name" not in a:
                msg = f"{where}: arms[{i}] must be a name or {{name, weight}}, got {a!r}"
                raise ConfigError(msg)
            weight = a.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, int | float):
                msg = f"{where}: arms[{i}].weight must be a number, got {weight!r}"
                raise ConfigError(msg)
            arms.append(Arm(str(a["name"]), float(weight)))
        rails = _guardrails(data.get("guardrails"), where)
        ms = data.get("min_samples", {})
        if not isinstance(ms, Mapping) or set(ms) - {"units", "requests", "sessions", "ratings"}:
            msg = f"{where}: min_samples takes units, requests, sessions, ratings; got {ms!r}"
            raise ConfigError(msg)
        every = data.get("evaluate_every_s", 60)
        if isinstance(every, bool) or not isinstance(every, int | float):
            msg = f"{where}: evaluate_every_s must be a number of seconds, got {every!r}"
            raise ConfigError(msg)
        kwargs: dict[str, Any] = {
            "id": exp_id,
            "arms": tuple(arms),
            "control": str(data.get("control", "") or ""),
            "unit": data.get("unit", "unit_id"),
            "guardrails": rails,
            "min_samples": MinSamples(**dict(ms)),
            "evaluate_every_ms": round(float(every) * 1000),
            "description": str(data.get("description", "") or ""),
        }
        if "rating_looks" in data:
            kwargs["rating_looks"] = data["rating_looks"]
        for key in ("alpha", "srm_alpha", "pollution_min_diff", "eval_min_gain"):
            if key in data:
                v = data[key]
                if isinstance(v, bool) or not isinstance(v, int | float):
                    msg = f"{where}: {key} must be a number, got {v!r}"
                    raise ConfigError(msg)
                kwargs[key] = float(v)
        if "evals_lower_is_better" in data:
            lower = data["evals_lower_is_better"]
            if not isinstance(lower, list) or not all(isinstance(x, str) for x in lower):
                msg = f"{where}: evals_lower_is_better must be a list of metric names"
                raise ConfigError(msg)
            kwargs["evals_lower_is_better"] = tuple(lower)
        if data.get("start_ms") is not None:
            start = data["start_ms"]
            if isinstance(start, bool) or not isinstance(start, int) or start < 0:
                msg = f"{where}: start_ms must be epoch milliseconds, got {start!r}"
                raise ConfigError(msg)
            kwargs["start_ms"] = start
        return cls(**kwargs)

    def to_mapping(self) -> dict[str, Any]:
        """The inverse of :meth:`from_mapping` (plain JSON/YAML values)."""
        rails: dict[str, dict[str, float]] = {}
        for g in self.guardrails:
            rails.setdefault(g.metric, {})[g.key] = g.limit
        out: dict[str, Any] = {
            "id": self.id,
            "unit": self.unit,
            "arms": [{"name": a.name, "weight": a.weight} for a in self.arms],
            "control": self.control,
            "guardrails": rails,
            "min_samples": {
                "units": self.min_samples.units,
                "requests": self.min_samples.requests,
                "sessions": self.min_samples.sessions,
                "ratings": self.min_samples.ratings,
            },
            "alpha": self.alpha,
            "srm_alpha": self.srm_alpha,
            "pollution_min_diff": self.pollution_min_diff,
            "eval_min_gain": self.eval_min_gain,
            "evals_lower_is_better": list(self.evals_lower_is_better),
            "evaluate_every_s": self.evaluate_every_ms / 1000,
            "rating_looks": self.rating_looks,
            "description": self.description,
        }
        if self.start_ms is not None:
            out["start_ms"] = self.start_ms
        return out


def _guardrails(raw: object, where: str) -> tuple[Guardrail, ...]:
    if raw is None:
        return DEFAULT_GUARDRAILS
    if not isinstance(raw, Mapping):
        msg = (
            f"{where}: guardrails must map a metric to its constraints, "
            "e.g. ttft_p95: {max_ratio: 1.1}"
        )
        raise ConfigError(msg)
    out = []
    for metric, constraints in raw.items():
        if not isinstance(constraints, Mapping) or not constraints:
            msg = f"{where}: guardrail {metric} needs constraints, e.g. {{max_ratio: 1.1}}"
            raise ConfigError(msg)
        for key, limit in constraints.items():
            if key not in CONSTRAINTS:
                known = ", ".join(CONSTRAINTS)
                msg = f"{where}: guardrail {metric}: unknown constraint {key!r} ({known})"
                raise ConfigError(msg)
            if isinstance(limit, bool) or not isinstance(limit, int | float):
                msg = f"{where}: guardrail {metric}.{key} must be a number, got {limit!r}"
                raise ConfigError(msg)
            kind, bound = CONSTRAINTS[key]
            out.append(Guardrail(str(metric), kind, bound, float(limit)))  # type: ignore[arg-type]
    return tuple(out)
