"""Experiment routing: layers, deterministic hashing, release overrides. Pure.

Overlapping experiments after Tang, Agarwal, O'Brien & Meyer, "Overlapping
Experiment Infrastructure: More, Better, Faster Experimentation" (KDD 2010):

- a **layer** owns the whole unit space once. A unit's position in a layer is
  ``u = blake2b(salt ‖ 0x00 ‖ unit_id) / 2⁶⁴`` in [0, 1): the same on every
  machine, in every process, across restarts (no ``hash()`` randomisation,
  nothing stored);
- the experiments of one layer take **disjoint slices** of [0, 1) in file
  order (``traffic`` = the slice's width), so a unit is in at most one
  experiment per layer: experiments of one layer are mutually exclusive;
- layers use different salts, so their positions are independent: the arms of
  an experiment in one layer are balanced across the arms of every experiment
  in another — experiments in different layers are **orthogonal**;
- inside its experiment's slice, a unit's arm is the sub-slice its position
  falls in, sub-slices proportional to the arms' weights::

      layer "release" (salt "release")      u ─────────────────────────────▶
      0        0.45       0.5                          1.0
      ├ control ┼ canary ─┤ (experiment canary-v2, traffic 0.5) ├── not in any ──┤

Concurrent prompt experiments: put them in different layers (say ``prompt``
and ``release``) and each request gets one arm in each; a test builds the
arm × arm table of 20,000 units and finds it independent (chi-square), and
finds a shared salt dependent. A request is sent with one prompt: keep prompt
versions in one layer (if two layers set one, the first layer's wins). The event
of a request in several experiments names the primary one in
``experiment``/``variant`` (an event has room for one) and lists all of them in
``experiments`` (:meth:`Selection.tags`); its ``prompt_version`` is the one it
was served with, whichever layer chose it (:attr:`Selection.prompt_version`).

A release decision does not re-hash anything: it *overrides* arms. A rollback
maps the rolled-back arm (every treatment when the decision names none) to
the control; a promote maps every arm to the promoted one. A unit therefore
keeps its assigned arm for the life of the experiment, and its *served* arm
changes only by a decision. Changing the order, traffic or weights in the
file moves units: treat a running experiment's definition as frozen.
"""

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from tailguard.gateway.errors import RoutingConfigError

__all__ = [
    "PRIMARY",
    "ArmRoute",
    "ExperimentRoute",
    "Layer",
    "Override",
    "Route",
    "Router",
    "Selection",
    "unit_point",
]

#: Name of the default upstream (``--upstream``); ``--upstream-canary`` is ``canary``.
PRIMARY: Final = "primary"
_SCALE: Final = float(2**64)


def unit_point(salt: str, unit: str) -> float:
    """The unit's position in a layer: uniform in [0, 1), stable everywhere.

    blake2b (not Python's ``hash``, which is salted per process) of the layer
    salt and the unit id, read as a 64-bit big-endian integer over 2⁶⁴.
    """
    digest = hashlib.blake2b(
        salt.encode() + b"\x00" + unit.encode(), digest_size=8, person=b"tailguard-gw"
    ).digest()
    return int.from_bytes(digest, "big") / _SCALE


@dataclass(frozen=True, slots=True)
class ArmRoute:
    """One arm: its planned weight, the upstream that serves it, its prompt version."""

    name: str
    weight: float
    upstream: str | None = None
    prompt_version: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            msg = "an arm needs a non-empty name"
            raise RoutingConfigError(msg)
        if not (isinstance(self.weight, int | float) and math.isfinite(self.weight)):
            msg = f"arm {self.name}: weight must be a finite number, got {self.weight!r}"
            raise RoutingConfigError(msg)
        if self.weight <= 0:
            msg = f"arm {self.name}: weight must be > 0, got {self.weight}"
            raise RoutingConfigError(msg)


@dataclass(frozen=True, slots=True)
class ExperimentRoute:
    """An experiment as the gateway routes it."""

    id: str
    arms: tuple[ArmRoute, ...]
    control: str
    #: Width of the experiment's slice of its layer, in (0, 1].
    traffic: float = 1.0
    #: Randomisation unit: ``unit_id`` (unit header / body ``user``) or ``session_id``.
    unit: str = "unit_id"
    #: Cumulative upper bounds of the arms' sub-slices, in [0, 1] (derived).
    _bounds: tuple[float, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"experiment {self.id}"
        if len(self.arms) < 2:
            msg = f"{where}: needs at least two arms"
            raise RoutingConfigError(msg)
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            msg = f"{where}: arm names must be unique, got {names}"
            raise RoutingConfigError(msg)
        if self.control not in names:
            msg = f"{where}: control {self.control!r} is not an arm ({', '.join(names)})"
            raise RoutingConfigError(msg)
        if self.unit not in ("unit_id", "session_id"):
            msg = f"{where}: unit must be unit_id or session_id, got {self.unit!r}"
            raise RoutingConfigError(msg)
        if not (isinstance(self.traffic, int | float) and 0.0 < self.traffic <= 1.0):
            msg = f"{where}: traffic must be in (0, 1], got {self.traffic!r}"
            raise RoutingConfigError(msg)
        total = sum(a.weight for a in self.arms)
        bounds, acc = [], 0.0
        for a in self.arms:
            acc += a.weight / total
            bounds.append(acc)
        bounds[-1] = 1.0
        object.__setattr__(self, "_bounds", tuple(bounds))

    @property
    def weights(self) -> dict[str, float]:
        total = sum(a.weight for a in self.arms)
        return {a.name: a.weight / total for a in self.arms}

    def arm(self, name: str) -> ArmRoute:
        for a in self.arms:
            if a.name == name:
                return a
        msg = f"experiment {self.id} has no arm {name!r}"
        raise KeyError(msg)

    def arm_at(self, position: float) -> ArmRoute:
        """The arm whose sub-slice holds ``position`` ∈ [0, 1)."""
        for a, upper in zip(self.arms, self._bounds, strict=True):
            if position < upper:
                return a
        return self.arms[-1]


@dataclass(frozen=True, slots=True)
class Layer:
    """Experiments that exclude each other: disjoint slices of one hash space."""

    name: str
    experiments: tuple[ExperimentRoute, ...]
    salt: str = ""
    _starts: tuple[float, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            msg = "a layer needs a non-empty name"
            raise RoutingConfigError(msg)
        if not self.salt:
            object.__setattr__(self, "salt", self.name)
        starts, acc = [], 0.0
        for e in self.experiments:
            starts.append(acc)
            acc += e.traffic
        if acc > 1.0 + 1e-9:
            msg = (
                f"layer {self.name}: the traffic of its experiments adds up to {acc:g} > 1; "
                "experiments of one layer share its units, lower their traffic or move one "
                "to another layer"
            )
            raise RoutingConfigError(msg)
        object.__setattr__(self, "_starts", tuple(starts))

    def assign(
        self, unit: str | None, session: str | None = None
    ) -> tuple[ExperimentRoute, ArmRoute, str] | None:
        """The experiment, assigned arm and unit id in this layer, or None.

        Each experiment of the layer is randomised by its own kind of unit; a
        request without that id is in none of them.
        """
        points: dict[str, float] = {}
        for e, start in zip(self.experiments, self._starts, strict=True):
            key = session if e.unit == "session_id" else unit
            if not key:
                continue
            u = points.get(key)
            if u is None:
                u = points[key] = unit_point(self.salt, key)
            if start <= u < start + e.traffic:
                return e, e.arm_at((u - start) / e.traffic), key
        return None


@dataclass(frozen=True, slots=True)
class Override:
    """The last routing-relevant release decision of one experiment."""

    experiment: str
    decision: str
    arm: str | None
    generation: int
    seq: int
    event_id: str
    applied_ms: int = 0

    def newer_than(self, other: "Override | None") -> bool:
        return other is None or (self.generation, self.seq) > (other.generation, other.seq)

    def served(self, experiment: ExperimentRoute, assigned: str) -> str:
        """The arm that serves a unit assigned to ``assigned`` under this decision."""
        names = {a.name for a in experiment.arms}
        if self.decision == "rollback":
            if self.arm is None or self.arm == experiment.control or self.arm not in names:
                return experiment.control  # every treatment back to the control
            return experiment.control if assigned == self.arm else assigned
        if self.decision == "promote" and self.arm in names:
            return self.arm
        return assigned


@dataclass(frozen=True, slots=True)
class Route:
    """Where one unit goes in one layer."""

    layer: str
    experiment: str
    unit: str
    assigned: str
    served: str
    upstream: str | None
    prompt_version: str | None


@dataclass(frozen=True, slots=True)
class Selection:
    """All of a request's routes, and the one stamped on its event."""

    routes: tuple[Route, ...]
    upstream: str = PRIMARY

    @property
    def primary(self) -> Route | None:
        """The route stamped on the event: the one that picked the upstream, else the
        first layer's. An event has room for one experiment."""
        for r in self.routes:
            if r.upstream is not None:
                return r
        return self.routes[0] if self.routes else None

    @property
    def prompt_version(self) -> str | None:
        """The prompt version the request is served with: the first layer's that sets one."""
        for r in self.routes:
            if r.prompt_version is not None:
                return r.prompt_version
        return None

    def tags(self) -> list[dict[str, str]]:
        """One ``{experiment, variant, layer[, prompt_version]}`` per route (the
        inference event's ``experiments`` field)."""
        out = []
        for r in self.routes:
            tag = {"experiment": r.experiment, "variant": r.served, "layer": r.layer}
            if r.prompt_version is not None:
                tag["prompt_version"] = r.prompt_version
            out.append(tag)
        return out


_NONE: Final = Selection(())


@dataclass(frozen=True, slots=True)
class Router:
    """Layers plus the release overrides in force; immutable (swap, never mutate)."""

    layers: tuple[Layer, ...] = ()
    overrides: Mapping[str, Override] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for layer in self.layers:
            for e in layer.experiments:
                if e.id in seen:
                    msg = f"experiment {e.id} is in layers {seen[e.id]} and {layer.name}"
                    raise RoutingConfigError(msg)
                seen[e.id] = layer.name
        salts = [layer.salt for layer in self.layers]
        if len(set(salts)) != len(salts):
            msg = f"layers need distinct salts (else they are not orthogonal), got {salts}"
            raise RoutingConfigError(msg)

    @property
    def experiments(self) -> dict[str, ExperimentRoute]:
        return {e.id: e for layer in self.layers for e in layer.experiments}

    def with_overrides(self, overrides: Mapping[str, Override]) -> "Router":
        return Router(self.layers, dict(overrides))

    def select(self, unit: str | None, session: str | None = None) -> Selection:
        """Routes of a request in every layer; without a unit id it is in no
        experiment and goes to the primary upstream."""
        if not (unit or session) or not self.layers:
            return _NONE
        routes: list[Route] = []
        upstream: str | None = None
        for layer in self.layers:
            hit = layer.assign(unit, session)
            if hit is None:
                continue
            exp, arm, key = hit
            served_name = arm.name
            override = self.overrides.get(exp.id)
            if override is not None:
                served_name = override.served(exp, arm.name)
            served = arm if served_name == arm.name else exp.arm(served_name)
            routes.append(
                Route(layer.name, exp.id, key, arm.name, served.name, served.upstream,
                      served.prompt_version)
            )  # fmt: skip
            if upstream is None and served.upstream is not None:
                upstream = served.upstream
        return Selection(tuple(routes), upstream or PRIMARY)

    def upstreams(self) -> set[str]:
        """Every upstream name an arm refers to."""
        return {
            a.upstream
            for layer in self.layers
            for e in layer.experiments
            for a in e.arms
            if a.upstream is not None
        }


def layers_of(experiments: Sequence[tuple[str, ExperimentRoute]]) -> tuple[Layer, ...]:
    """Group ``(layer name, experiment)`` pairs into layers, keeping first-seen order."""
    grouped: dict[str, list[ExperimentRoute]] = {}
    for name, e in experiments:
        grouped.setdefault(name, []).append(e)
    return tuple(Layer(name, tuple(es)) for name, es in grouped.items())
