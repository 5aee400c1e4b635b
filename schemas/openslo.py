"""OpenSLO v1 YAML → :class:`~tailguard.streams.burn.SloSpec`.

What tailguard reads of an OpenSLO v1 document (``apiVersion: openslo/v1``;
several documents may share one file, separated by ``---``)::

    apiVersion: openslo/v1
    kind: SLO
    metadata:
      name: ttft-p99                 # the SLO's name in breaches: [A-Za-z0-9][A-Za-z0-9._-]*
      displayName: …                 # optional
      labels:                        # optional; selects series besides spec.service
        model: "llama-*"             #   glob or list of globs; absent = "*"
        variant: "*"
        tenant: ["acme", "globex"]
    spec:
      description: …                 # optional
      service: chat                  # glob of the series' service ("*" = every service)
      indicator:                     # inline; or indicatorRef: <a kind: SLI document's name>
        metadata: {name: ttft}
        spec:
          thresholdMetric:           # latency SLIs only: the objective's op/value is the threshold
            metricSource:
              type: tailguard
              spec: {sli: ttft_ms}
      timeWindow:
        - duration: 30d              # <n>m|h|d|w; rolling windows only
          isRolling: true
      budgetingMethod: Occurrences   # Timeslices / RatioTimeslices: unsupported
      objectives:
        - op: lte                    # lte | lt (thresholdMetric only)
          value: 800                 # threshold in ms (thresholdMetric only)
          target: 0.99               # or targetPercent: 99

A ``ratioMetric`` names the good (or the bad) events and the total; both
``metricSource.spec`` name the same SLI, and the objectives carry only a
target::

    ratioMetric:
      counter: true
      good:  {metricSource: {type: tailguard, spec: {sli: ttft_ms, threshold_ms: 300}}}
      total: {metricSource: {type: tailguard, spec: {sli: ttft_ms}}}

The SLI vocabulary of ``metricSource.spec`` (``type: tailguard``)::

    sli         good events (bad = the others)           further keys (good/bad only)
    ttft_ms     requests with TTFT ≤ threshold            threshold_ms, op
    itl_ms      streamed gaps ≤ threshold (per gap)       threshold_ms, op
    e2e_ms      requests with E2E ≤ threshold             threshold_ms, op
    success     requests that did not fail                —
                (error, timeout, rejected; cancelled
                requests are left out)
    goodput     requests meeting every latency threshold  ttft_threshold_ms, tpot_threshold_ms,
                (DistServe; TPOT ≤ the ITL threshold)     e2e_threshold_ms
    composite   weighted compliance w·TTFT + (1−w)·ITL    ttft_threshold_ms, itl_threshold_ms,
                                                          ttft_weight, itl_weight

``op`` is ``lte`` (default) or ``lt`` for good events, ``gt`` (default) or
``gte`` for bad ones; counters count ``≤ threshold`` at ingest, so ``lt`` and
``lte`` differ only for a value exactly at the threshold. ``tpot_ms`` is
refused with a pointer to ``goodput``: no exact per-request TPOT counters exist.

Everything else OpenSLO allows (``alertPolicies``, ``kind: Service`` and
``kind: DataSource`` documents, annotations) is accepted and ignored;
``kind: SLI`` documents are read only for ``indicatorRef``. An SLO with several
objectives becomes one :class:`SloSpec` per objective, named ``<name>/<n>``
(1-based).

Every error is a :class:`SloConfigError` whose message starts with
``<file>:<line>:`` — the line of the node at fault, found by composing the YAML
node tree (``yaml.compose_all``) instead of loading plain values.
"""

import math
import re
from collections.abc import Callable
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

import yaml
from tailguard.schemas.errors import SchemaError
from tailguard.streams.burn import LATENCY_SLIS, SLIS, Selector, SloSpec, window_ms
from tailguard.streams.errors import ConfigError
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = [
    "API_VERSION",
    "BUNDLED",
    "SloConfigError",
    "bundled_slos",
    "default_slos",
    "load_slos",
    "parse_slos",
]

API_VERSION = "openslo/v1"
#: The ready-made definitions shipped in ``tailguard/schemas/slos/``.
BUNDLED = ("defaults.yaml", "article-examples.yaml")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_IGNORED_KINDS = frozenset({"Service", "DataSource"})
_SELECTOR_LABELS = ("model", "variant", "tenant")
_T = TypeVar("_T")


class SloConfigError(SchemaError):
    """An SLO definition that cannot be used; the message starts with ``file:line:``.

    ::

        TailguardError (Exception)
        └── SchemaError (TailguardError, ValueError)
            └── SloConfigError      unparsable YAML, unknown SLI / operator /
                                    budgeting method, a value out of range
    """


class _Reader:
    """Walks composed YAML nodes, turning every complaint into a located SloConfigError."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._constructor = SafeConstructor()
        #: The key node of each mapping value seen, so a complaint about a whole
        #: mapping or list points at the line of its key (``spec:``), not its first entry.
        self._keys: dict[int, Node] = {}

    def error(self, node: Node | None, problem: str) -> SloConfigError:
        if node is not None and not isinstance(node, ScalarNode):
            node = self._keys.get(id(node), node)
        line = f"{node.start_mark.line + 1}" if node is not None else "1"
        return SloConfigError(f"{self.source}:{line}: {problem}")

    def value(self, node: Node) -> Any:
        return self._constructor.construct_object(node, deep=True)

    def mapping(self, node: Node, what: str) -> dict[str, tuple[Node, Node]]:
        """``key → (key node, value node)`` of a mapping; duplicate keys are errors."""
        if not isinstance(node, MappingNode):
            raise self.error(node, f"{what} must be a mapping")
        out: dict[str, tuple[Node, Node]] = {}
        for key_node, value_node in node.value:
            key = self.value(key_node)
            if not isinstance(key, str):
                raise self.error(key_node, f"{what} has a non-string key {key!r}")
            if key in out:
                raise self.error(key_node, f"{what} repeats the key {key!r}")
            out[key] = (key_node, value_node)
            self._keys[id(value_node)] = key_node
        return out

    def sequence(self, node: Node, what: str) -> list[Node]:
        if not isinstance(node, SequenceNode):
            raise self.error(node, f"{what} must be a list")
        return list(node.value)

    def require(self, m: dict[str, tuple[Node, Node]], key: str, at: Node, what: str) -> Node:
        if key not in m:
            raise self.error(at, f"{what} needs {key!r}")
        return m[key][1]

    def optional(self, m: dict[str, tuple[Node, Node]], key: str) -> Node | None:
        entry = m.get(key)
        return None if entry is None else entry[1]

    def typed(self, node: Node, kind: type[_T], what: str, check: Callable[[Any], bool]) -> _T:
        value = self.value(node) if isinstance(node, ScalarNode) else None
        if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
            raise self.error(node, f"{what} must be a {kind.__name__}, got {_show(node)}")
        if not check(value):
            raise self.error(node, f"{what} is out of range: {value!r}")
        return value

    def string(self, node: Node, what: str) -> str:
        value = self.typed(node, str, what, lambda _: True)
        if not value.strip():
            raise self.error(node, f"{what} must not be empty")
        return value

    def number(self, node: Node, what: str, check: Callable[[float], bool]) -> float:
        value = self.value(node) if isinstance(node, ScalarNode) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(node, f"{what} must be a number, got {_show(node)}")
        if not math.isfinite(value) or not check(value):
            raise self.error(node, f"{what} is out of range: {value!r}")
        return float(value)

    def positive_ms(self, node: Node, what: str) -> float:
        return self.number(node, what, lambda v: v > 0)


def _empty(node: Node | None) -> bool:
    """An empty YAML document (``---`` alone, or ``~``)."""
    return node is None or (isinstance(node, ScalarNode) and node.tag == "tag:yaml.org,2002:null")


def _show(node: Node) -> str:
    if isinstance(node, ScalarNode):
        return repr(node.value)
    return "a list" if isinstance(node, SequenceNode) else "a mapping"


# ------------------------------------------------------------------ the indicator

#: Keys of metricSource.spec for good/bad events, per SLI.
_EVENT_KEYS: dict[str, frozenset[str]] = {
    **{sli: frozenset({"sli", "threshold_ms", "op"}) for sli in LATENCY_SLIS},
    "success": frozenset({"sli"}),
    "goodput": frozenset({"sli", "ttft_threshold_ms", "tpot_threshold_ms", "e2e_threshold_ms"}),
    "composite": frozenset(
        {"sli", "ttft_threshold_ms", "itl_threshold_ms", "ttft_weight", "itl_weight"}
    ),
}


class _Indicator:
    """What an indicator contributes to each SloSpec built from it."""

    def __init__(self, sli: str, kind: str, fields: dict[str, Any]) -> None:
        self.sli = sli
        self.kind = kind  # "threshold" or "ratio"
        self.fields = fields


def _source_spec(
    r: _Reader, holder: Node, what: str
) -> tuple[dict[str, tuple[Node, Node]], str, Node]:
    """``metricSource.spec`` of a metric: its keys, its SLI name and the node naming it."""
    m = r.mapping(holder, what)
    if "metricSourceRef" in m and "metricSource" not in m:
        raise r.error(
            m["metricSourceRef"][0],
            f"{what}: metricSourceRef is not supported; inline a metricSource of type tailguard",
        )
    source = r.mapping(r.require(m, "metricSource", holder, what), f"{what}.metricSource")
    kind_node = r.require(source, "type", holder, f"{what}.metricSource")
    kind = r.string(kind_node, f"{what}.metricSource.type")
    if kind.lower() != "tailguard":
        raise r.error(
            kind_node,
            f"{what}.metricSource.type {kind!r} is not supported; tailguard computes its own "
            "SLIs from the event stream: use type: tailguard",
        )
    spec_node = r.require(source, "spec", holder, f"{what}.metricSource")
    spec = r.mapping(spec_node, f"{what}.metricSource.spec")
    sli_node = r.require(spec, "sli", spec_node, f"{what}.metricSource.spec")
    sli = r.string(sli_node, f"{what}.metricSource.spec.sli")
    if sli == "tpot_ms":
        raise r.error(
            sli_node,
            "sli 'tpot_ms' has no burn-rate counters (TPOT is not counted per threshold); "
            "hold TPOT through 'goodput' (tpot_threshold_ms) or per gap through 'itl_ms'",
        )
    if sli not in SLIS:
        raise r.error(sli_node, f"unknown sli {sli!r}; choose one of {', '.join(SLIS)}")
    return spec, sli, sli_node


def _check_keys(
    r: _Reader, spec: dict[str, tuple[Node, Node]], allowed: frozenset[str], what: str
) -> None:
    for key, (key_node, _) in spec.items():
        if key not in allowed:
            raise r.error(
                key_node,
                f"{what} has unknown key {key!r}; allowed here: {', '.join(sorted(allowed))}",
            )


def _event_fields(
    r: _Reader, spec: dict[str, tuple[Node, Node]], sli: str, role: str, at: Node, what: str
) -> dict[str, Any]:
    _check_keys(r, spec, _EVENT_KEYS[sli], what)
    fields: dict[str, Any] = {}
    if sli in LATENCY_SLIS:
        fields[sli] = r.positive_ms(
            r.require(spec, "threshold_ms", at, what), f"{what}.threshold_ms"
        )
        allowed_ops = ("lte", "lt") if role == "good" else ("gt", "gte")
        op_node = r.optional(spec, "op")
        op = allowed_ops[0] if op_node is None else r.string(op_node, f"{what}.op")
        if op not in allowed_ops:
            raise r.error(
                op_node,
                f"unknown or unsupported operator {op!r} for {role} events; use "
                f"{' or '.join(allowed_ops)} (latency SLIs hold values at most a threshold)",
            )
        # bad "gt" ⇔ good "lte"; bad "gte" ⇔ good "lt".
        fields["op"] = {"gt": "lte", "gte": "lt"}.get(op, op)
    for key, target in (
        ("ttft_threshold_ms", "ttft_ms"),
        ("itl_threshold_ms", "itl_ms"),
        ("tpot_threshold_ms", "itl_ms"),
        ("e2e_threshold_ms", "e2e_ms"),
    ):
        node = r.optional(spec, key)
        if node is not None:
            fields[target] = r.positive_ms(node, f"{what}.{key}")
    for key in ("ttft_weight", "itl_weight"):
        node = r.optional(spec, key)
        if node is not None:
            fields[key] = r.number(node, f"{what}.{key}", lambda v: 0 <= v <= 1)
    if ("ttft_weight" in fields) != ("itl_weight" in fields):
        raise r.error(
            at, f"{what}: give both ttft_weight and itl_weight (they sum to 1) or neither"
        )
    return fields


def _indicator(r: _Reader, node: Node, what: str) -> _Indicator:
    """An SLI body: the ``spec`` of an inline indicator or of a ``kind: SLI`` document."""
    m = r.mapping(node, what)
    metrics = [k for k in ("thresholdMetric", "ratioMetric") if k in m]
    if len(metrics) != 1:
        raise r.error(node, f"{what} needs exactly one of thresholdMetric, ratioMetric")
    if metrics[0] == "thresholdMetric":
        metric = m["thresholdMetric"][1]
        spec, sli, sli_node = _source_spec(r, metric, f"{what}.thresholdMetric")
        if sli not in LATENCY_SLIS:
            raise r.error(
                sli_node,
                f"sli {sli!r} has no per-event value to hold to a threshold; "
                "define it with ratioMetric (good/total)",
            )
        _check_keys(r, spec, frozenset({"sli"}), f"{what}.thresholdMetric.metricSource.spec")
        return _Indicator(sli, "threshold", {})
    ratio_node = m["ratioMetric"][1]
    ratio = r.mapping(ratio_node, f"{what}.ratioMetric")
    for unsupported in ("raw", "rawType"):
        if unsupported in ratio:
            raise r.error(
                ratio[unsupported][0],
                f"ratioMetric.{unsupported} is not supported; name good (or bad) and total events",
            )
    roles = [k for k in ("good", "bad") if k in ratio]
    if len(roles) != 1:
        raise r.error(ratio_node, f"{what}.ratioMetric needs exactly one of good, bad (and total)")
    role = roles[0]
    event_node = ratio[role][1]
    spec, sli, sli_node = _source_spec(r, event_node, f"{what}.ratioMetric.{role}")
    fields = _event_fields(
        r, spec, sli, role, sli_node, f"{what}.ratioMetric.{role}.metricSource.spec"
    )
    total_node = r.require(ratio, "total", ratio_node, f"{what}.ratioMetric")
    total_spec, total_sli, total_sli_node = _source_spec(r, total_node, f"{what}.ratioMetric.total")
    if total_sli != sli:
        raise r.error(
            total_sli_node,
            f"ratioMetric total counts sli {total_sli!r} but {role} counts {sli!r}; "
            "both must name the same SLI",
        )
    _check_keys(r, total_spec, frozenset({"sli"}), f"{what}.ratioMetric.total.metricSource.spec")
    return _Indicator(sli, "ratio", fields)


# ------------------------------------------------------------------ the SLO document


def _selector(
    r: _Reader, spec: dict[str, tuple[Node, Node]], meta: dict[str, tuple[Node, Node]], at: Node
) -> Selector:
    service = r.string(r.require(spec, "service", at, "spec"), "spec.service")
    patterns: dict[str, tuple[str, ...]] = {"service": (service,)}
    labels_node = r.optional(meta, "labels")
    if labels_node is not None:
        labels = r.mapping(labels_node, "metadata.labels")
        for label in _SELECTOR_LABELS:
            entry = labels.get(label)
            if entry is None:
                continue
            value_node = entry[1]
            if isinstance(value_node, SequenceNode):
                items = r.sequence(value_node, f"metadata.labels.{label}")
                if not items:
                    raise r.error(value_node, f"metadata.labels.{label} is an empty list")
                patterns[label] = tuple(r.string(n, f"metadata.labels.{label}") for n in items)
            else:
                patterns[label] = (r.string(value_node, f"metadata.labels.{label}"),)
    return Selector(**patterns)


def _window(r: _Reader, spec: dict[str, tuple[Node, Node]], at: Node) -> int:
    windows = r.sequence(r.require(spec, "timeWindow", at, "spec"), "spec.timeWindow")
    if len(windows) != 1:
        raise r.error(at, f"spec.timeWindow must hold exactly one window, got {len(windows)}")
    tw_node = windows[0]
    tw = r.mapping(tw_node, "spec.timeWindow[0]")
    rolling_node = r.optional(tw, "isRolling")
    if (
        rolling_node is None
        or r.typed(rolling_node, bool, "timeWindow.isRolling", lambda _: True) is not True
    ):
        raise r.error(
            rolling_node or tw_node,
            "calendar-aligned windows are not supported: set timeWindow isRolling: true",
        )
    duration_node = r.require(tw, "duration", tw_node, "spec.timeWindow[0]")
    duration = r.string(duration_node, "timeWindow.duration")
    if re.fullmatch(r"[1-9][0-9]*[MQY]", duration):
        raise r.error(
            duration_node,
            f"duration {duration!r}: months, quarters and years are calendar units; "
            "use days, e.g. 30d",
        )
    try:
        ms = window_ms(duration)
    except ConfigError:
        raise r.error(
            duration_node, f"duration {duration!r} is not <n>m, <n>h, <n>d or <n>w (e.g. 30d)"
        ) from None
    if ms < 3_600_000:
        raise r.error(
            duration_node, f"duration {duration!r} is shorter than 1h: too short to budget"
        )
    return ms


def _budgeting(r: _Reader, spec: dict[str, tuple[Node, Node]], at: Node) -> None:
    node = r.require(spec, "budgetingMethod", at, "spec")
    method = r.string(node, "spec.budgetingMethod")
    if method in ("Timeslices", "RatioTimeslices"):
        raise r.error(
            node,
            f"budgetingMethod {method!r} is unsupported: tailguard counts events; use Occurrences",
        )
    if method != "Occurrences":
        raise r.error(node, f"unknown budgetingMethod {method!r}; use Occurrences")


def _target(r: _Reader, objective: dict[str, tuple[Node, Node]], at: Node, what: str) -> float:
    has = [k for k in ("target", "targetPercent") if k in objective]
    if len(has) != 1:
        raise r.error(at, f"{what} needs exactly one of target (0..1), targetPercent (0..100)")
    node = objective[has[0]][1]
    scale = 1.0 if has[0] == "target" else 100.0
    value = r.number(node, f"{what}.{has[0]}", lambda v: 0 < v < scale)
    return value / scale


def _slo(
    r: _Reader, doc: Node, top: dict[str, tuple[Node, Node]], slis: dict[str, Node]
) -> list[SloSpec]:
    meta_node = r.require(top, "metadata", doc, "an SLO document")
    meta = r.mapping(meta_node, "metadata")
    name_node = r.require(meta, "name", meta_node, "metadata")
    name = r.string(name_node, "metadata.name")
    if not _NAME.fullmatch(name):
        raise r.error(name_node, f"metadata.name {name!r} must match {_NAME.pattern}")
    display_node = r.optional(meta, "displayName")
    display = r.string(display_node, "metadata.displayName") if display_node else ""
    spec_node = r.require(top, "spec", doc, "an SLO document")
    spec = r.mapping(spec_node, "spec")
    description_node = r.optional(spec, "description")
    description = r.string(description_node, "spec.description") if description_node else ""
    selector = _selector(r, spec, meta, spec_node)
    has = [k for k in ("indicator", "indicatorRef") if k in spec]
    if len(has) != 1:
        raise r.error(spec_node, "spec needs exactly one of indicator, indicatorRef")
    if has[0] == "indicator":
        ind_node = spec["indicator"][1]
        ind = r.mapping(ind_node, "spec.indicator")
        indicator = _indicator(
            r, r.require(ind, "spec", ind_node, "spec.indicator"), "indicator.spec"
        )
    else:
        ref_node = spec["indicatorRef"][1]
        ref = r.string(ref_node, "spec.indicatorRef")
        if ref not in slis:
            raise r.error(
                ref_node, f"indicatorRef {ref!r} names no kind: SLI document in this file"
            )
        indicator = _indicator(r, slis[ref], f"SLI {ref}.spec")
    window = _window(r, spec, spec_node)
    _budgeting(r, spec, spec_node)
    objectives_node = r.require(spec, "objectives", spec_node, "spec")
    objectives = r.sequence(objectives_node, "spec.objectives")
    if not objectives:
        raise r.error(objectives_node, "spec.objectives is empty")
    out: list[SloSpec] = []
    for i, obj_node in enumerate(objectives, start=1):
        what = f"objectives[{i - 1}]"
        obj = r.mapping(obj_node, what)
        if "indicator" in obj or "indicatorRef" in obj:
            raise r.error(obj_node, "composite SLOs (an indicator per objective) are not supported")
        fields = dict(indicator.fields)
        target = _target(r, obj, obj_node, what)
        op_node, value_node = r.optional(obj, "op"), r.optional(obj, "value")
        if indicator.kind == "threshold":
            if op_node is None or value_node is None:
                raise r.error(
                    obj_node,
                    f"{what} of a thresholdMetric needs op and value (the threshold in ms)",
                )
            op = r.string(op_node, f"{what}.op")
            if op not in ("lte", "lt"):
                raise r.error(
                    op_node,
                    f"unknown or unsupported operator {op!r}; use lte or lt "
                    "(latency SLIs hold values at most a threshold)",
                )
            fields["op"] = op
            fields[indicator.sli] = r.positive_ms(value_node, f"{what}.value")
        elif op_node is not None or value_node is not None:
            raise r.error(
                op_node or value_node,
                f"{what}: op and value belong to a thresholdMetric; "
                "a ratioMetric objective has only a target",
            )
        obj_display = r.optional(obj, "displayName")
        try:
            out.append(
                SloSpec(
                    name=name if len(objectives) == 1 else f"{name}/{i}",
                    sli=indicator.sli,
                    target=target,
                    window_ms=window,
                    selector=selector,
                    display_name=r.string(obj_display, f"{what}.displayName")
                    if obj_display
                    else display,
                    description=description,
                    source=f"{r.source}:{obj_node.start_mark.line + 1}",
                    **fields,
                )
            )
        except ConfigError as exc:
            raise r.error(obj_node, str(exc)) from None
    return out


def parse_slos(text: str, source: str = "<string>") -> tuple[SloSpec, ...]:
    """Every SLO of an OpenSLO v1 YAML text (one or more documents), in file order.

    ``source`` names the text in error messages (a file name, ``admin:<command_id>``…).
    """
    r = _Reader(source)
    try:
        docs = [d for d in yaml.compose_all(text, Loader=yaml.SafeLoader) if not _empty(d)]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        msg = f"{source}:{line}: not valid YAML: {exc.problem or exc.context}"
        raise SloConfigError(msg) from None
    except yaml.YAMLError as exc:
        msg = f"{source}:1: not valid YAML: {exc}"
        raise SloConfigError(msg) from None
    parsed: list[tuple[Node, dict[str, tuple[Node, Node]], str]] = []
    slis: dict[str, Node] = {}
    for doc in docs:
        top = r.mapping(doc, "an OpenSLO document")
        api_node = r.require(top, "apiVersion", doc, "an OpenSLO document")
        api = r.string(api_node, "apiVersion")
        if api != API_VERSION:
            raise r.error(api_node, f"apiVersion {api!r} is not supported; use {API_VERSION}")
        kind_node = r.require(top, "kind", doc, "an OpenSLO document")
        kind = r.string(kind_node, "kind")
        if kind == "SLI":
            meta_node = r.require(top, "metadata", doc, "an SLI document")
            sli_name = r.string(
                r.require(r.mapping(meta_node, "metadata"), "name", meta_node, "metadata"),
                "metadata.name",
            )
            slis[sli_name] = r.require(top, "spec", doc, "an SLI document")
        elif kind != "SLO" and kind not in _IGNORED_KINDS:
            raise r.error(
                kind_node,
                f"kind {kind!r} is not supported; tailguard reads SLO (and SLI for indicatorRef) "
                "documents, and alerts by its burn-rate policy, not OpenSLO alert kinds",
            )
        parsed.append((doc, top, kind))
    specs: list[SloSpec] = []
    seen: dict[str, str] = {}
    for doc, top, kind in parsed:
        if kind != "SLO":
            continue
        for spec in _slo(r, doc, top, slis):
            if spec.name in seen:
                raise r.error(
                    doc, f"SLO name {spec.name!r} is defined twice (first at {seen[spec.name]})"
                )
            seen[spec.name] = spec.source
            specs.append(spec)
    if not specs:
        msg = f"{source}:1: holds no kind: SLO document (apiVersion: {API_VERSION})"
        raise SloConfigError(msg)
    return tuple(specs)


def load_slos(path: str | PathLike[str] | Traversable) -> tuple[SloSpec, ...]:
    """Every SLO of an OpenSLO v1 YAML file; errors name the file and the line."""
    name = str(path)
    file = Path(path) if isinstance(path, str | PathLike) else path
    try:
        data = file.read_bytes()
    except OSError as exc:
        msg = f"{name}: cannot read the SLO file ({exc.strerror or exc})"
        raise SloConfigError(msg) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        msg = f"{name}:{line}: not UTF-8 ({exc.reason})"
        raise SloConfigError(msg) from None
    return parse_slos(text, name)


@cache
def bundled_slos(name: str) -> tuple[SloSpec, ...]:
    """A ready-made file of ``tailguard/schemas/slos/`` (see :data:`BUNDLED`)."""
    if name not in BUNDLED:
        msg = f"no bundled SLO file {name!r}; choose one of {', '.join(BUNDLED)}"
        raise SloConfigError(msg)
    resource = files("tailguard.schemas").joinpath("slos").joinpath(name)
    return parse_slos(resource.read_text(encoding="utf-8"), f"tailguard/schemas/slos/{name}")


def default_slos() -> tuple[SloSpec, ...]:
    """The default SLOs: TTFT 99 % ≤ 800 ms, ITL 99 % ≤ 120 ms, composite ≥ 0.99,
    success ≥ 99.2 %."""
    return bundled_slos("defaults.yaml")
