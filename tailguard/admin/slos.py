"""SLO changes from the admin plane (pure): ``slo.set`` edits, validation, the merged set.

A worker's SLOs are its *base* set (``--slo-file`` or the built-in defaults)
with the admin overrides of the control topic on top (one ``slos`` record
holding every override's full definition, so a change of several SLOs applies
atomically). An override replaces the base SLO of the same name or adds a new
one; dropping it (``slo.reset``) brings the base definition back.

``slo.set`` takes either a whole OpenSLO v1 YAML text (``openslo``: every SLO
in it is added or replaced) or a named SLO and the fields to change::

    {"name": "ttft-p99", "target": 0.995}
    {"name": "ttft-p99", "threshold_ms": 1200}      # the threshold of its own SLI
    {"name": "composite", "ttft_ms": 1200, "itl_ms": 150}

Thresholds are also the values each series is *counted* against at ingest,
and a series counts one threshold per SLI (:func:`~tailguard.streams.burn.thresholds_for`).
So a threshold change carries over to every other SLO with the same selector
that held the same threshold at the same value ("kept in step", e.g.
``ttft-p99`` and ``composite`` both at 800 ms for every series), and the reply
lists every SLO it changed. A change that would leave two SLOs that may apply
to one series with different thresholds is refused as ``conflict`` (narrow a
selector, or change both).

When it applies (see :mod:`tailguard.agents.control`): a new *target* holds
from the next evaluation (the next closed minute) of every series; a new
*threshold* is counted for the events folded from then on — buckets already
filled keep the counts they were made with, so burn rates move over as their
windows roll.
"""

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from tailguard.admin.errors import CommandError
from tailguard.schemas.openslo import SloConfigError, parse_slos
from tailguard.streams.burn import LATENCY_SLIS, Selector, SloSpec
from tailguard.streams.errors import ConfigError

__all__ = [
    "EDITABLE",
    "check_consistent",
    "edit_slos",
    "merged",
    "slo_from_dict",
    "slo_to_dict",
]

#: Fields ``slo.set`` may change on a named SLO.
EDITABLE = ("target", "threshold_ms", "ttft_ms", "itl_ms", "e2e_ms", "display_name")
_LABELS = ("service", "model", "variant", "tenant")
_GLOB = set("*?[")


def slo_to_dict(spec: SloSpec) -> dict[str, Any]:
    """A JSON-able definition (what replies show and the control topic stores)."""
    return {
        "name": spec.name,
        "sli": spec.sli,
        "target": spec.target,
        "ttft_ms": spec.ttft_ms,
        "itl_ms": spec.itl_ms,
        "e2e_ms": spec.e2e_ms,
        "ttft_weight": spec.ttft_weight,
        "itl_weight": spec.itl_weight,
        "window_ms": spec.window_ms,
        "selector": {label: list(getattr(spec.selector, label)) for label in _LABELS},
        "op": spec.op,
        "display_name": spec.display_name,
        "description": spec.description,
        "source": spec.source,
    }


def slo_from_dict(d: Mapping[str, Any]) -> SloSpec:
    """The inverse of :func:`slo_to_dict`; ``ConfigError`` when the values are wrong."""
    selector = d.get("selector") or {}
    try:
        return SloSpec(
            name=str(d["name"]),
            sli=str(d["sli"]),
            target=float(d["target"]),
            ttft_ms=_opt_float(d.get("ttft_ms")),
            itl_ms=_opt_float(d.get("itl_ms")),
            e2e_ms=_opt_float(d.get("e2e_ms")),
            ttft_weight=float(d.get("ttft_weight", 0.7)),
            itl_weight=float(d.get("itl_weight", 0.3)),
            window_ms=int(d.get("window_ms", 30 * 86_400_000)),
            selector=Selector(**{label: tuple(selector.get(label, ("*",))) for label in _LABELS}),
            op=str(d.get("op", "lte")),
            display_name=str(d.get("display_name", "")),
            description=str(d.get("description", "")),
            source=str(d.get("source", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        msg = f"SLO definition is incomplete or has a wrong type: {exc!r}"
        raise ConfigError(msg) from None


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def merged(base: Sequence[SloSpec], overrides: Mapping[str, SloSpec]) -> list[SloSpec]:
    """Base SLOs with overrides replacing by name, then added ones in name order."""
    names = {s.name for s in base}
    out = [overrides.get(s.name, s) for s in base]
    out.extend(overrides[n] for n in sorted(overrides) if n not in names)
    return out


def _patterns_overlap(a: Iterable[str], b: Iterable[str]) -> bool:
    b = list(b)
    return any(p == q or _GLOB & set(p) or _GLOB & set(q) for p in a for q in b)


def _may_share_series(x: SloSpec, y: SloSpec) -> bool:
    """Conservative: whether some series could match both selectors."""
    return all(
        _patterns_overlap(getattr(x.selector, label), getattr(y.selector, label))
        for label in _LABELS
    )


def _thresholds(spec: SloSpec) -> dict[str, float]:
    out = {n: getattr(spec, n) for n in LATENCY_SLIS if getattr(spec, n) is not None}
    if spec.sli == "composite":
        out["ttft_weight"] = spec.ttft_weight
        out["itl_weight"] = spec.itl_weight
    return out


def check_consistent(specs: Sequence[SloSpec], changed: Iterable[str]) -> None:
    """Refuse (``conflict``) a set where a changed SLO and another that may share a series
    ask for different thresholds (SLOs that were already so are left alone)."""
    changed = set(changed)
    for x in specs:
        if x.name not in changed:
            continue
        tx = _thresholds(x)
        for y in specs:
            if y is x or not _may_share_series(x, y):
                continue
            ty = _thresholds(y)
            for field, value in tx.items():
                other = ty.get(field)
                if other is not None and not math.isclose(other, value):
                    raise CommandError(
                        "conflict",
                        f"SLO {x.name!r} would count {field} = {value:g} but SLO {y.name!r} "
                        f"(which may apply to the same series) counts {other:g}; a series "
                        "counts one threshold per SLI — change both, or narrow a selector",
                    )


def _number(args: Mapping[str, Any], name: str) -> float | None:
    if name not in args:
        return None
    value = args[name]
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise CommandError("bad_args", f"args.{name} must be a finite number, got {value!r}")
    return float(value)


def edit_slos(current: Sequence[SloSpec], args: Mapping[str, Any], *, source: str) -> list[SloSpec]:
    """The SLOs a ``slo.set`` changes or adds (new definitions), validated against ``current``.

    Raises ``CommandError`` (``bad_args``, ``not_found``, ``conflict``).
    """
    if "openslo" in args:
        extra = sorted(set(args) - {"openslo"})
        if extra:
            raise CommandError("bad_args", f"openslo is given alone; drop {extra}")
        text = args["openslo"]
        if not isinstance(text, str):
            raise CommandError("bad_args", "args.openslo must be the text of an OpenSLO v1 YAML")
        try:
            new = list(parse_slos(text, source))
        except SloConfigError as exc:
            raise CommandError("bad_args", str(exc)) from None
        return _validated(current, new)
    unknown = sorted(set(args) - {"name", *EDITABLE})
    if unknown:
        raise CommandError(
            "bad_args", f"slo.set does not take {unknown}; give name and any of {list(EDITABLE)}"
        )
    name = args.get("name")
    if not isinstance(name, str) or not name:
        raise CommandError("bad_args", "slo.set needs args.name (or args.openslo)")
    by_name = {s.name: s for s in current}
    spec = by_name.get(name)
    if spec is None:
        raise CommandError(
            "not_found", f"no SLO named {name!r}; known: {sorted(by_name)} (add one with openslo)"
        )
    if not set(args) & set(EDITABLE):
        raise CommandError("bad_args", f"slo.set {name}: nothing to change; give any of {EDITABLE}")
    thresholds: dict[str, float] = {}
    given = _number(args, "threshold_ms")
    if given is not None:
        if spec.sli not in LATENCY_SLIS:
            raise CommandError(
                "bad_args",
                f"SLO {name!r} holds {spec.sli}, which has no single threshold; name it "
                "(ttft_ms, itl_ms or e2e_ms)",
            )
        thresholds[spec.sli] = given
    for field in LATENCY_SLIS:
        value = _number(args, field)
        if value is not None:
            thresholds[field] = value
    changes: dict[str, Any] = dict(thresholds)
    target = _number(args, "target")
    if target is not None:
        changes["target"] = target
    if "display_name" in args:
        if not isinstance(args["display_name"], str):
            raise CommandError("bad_args", "args.display_name must be a string")
        changes["display_name"] = args["display_name"]
    out: dict[str, SloSpec] = {name: _replaced(spec, changes, source)}
    # Keep in step every other SLO that held the same threshold at the same value.
    for field, value in thresholds.items():
        old = getattr(spec, field)
        if old is None:
            continue
        for other in current:
            if other.name == name or getattr(other, field) is None:
                continue
            if math.isclose(getattr(other, field), old) and other.selector == spec.selector:
                base = out.get(other.name, other)
                out[other.name] = _replaced(base, {field: value}, source)
    return _validated(current, list(out.values()))


def _replaced(spec: SloSpec, changes: Mapping[str, Any], source: str) -> SloSpec:
    try:
        return replace(spec, **changes, source=source)
    except ConfigError as exc:
        raise CommandError("bad_args", str(exc)) from None


def _validated(current: Sequence[SloSpec], new: Sequence[SloSpec]) -> list[SloSpec]:
    replacing = {s.name: s for s in new}
    result = merged(current, replacing)
    check_consistent(result, replacing)
    return list(new)
