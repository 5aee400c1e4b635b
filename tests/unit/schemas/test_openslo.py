"""OpenSLO v1 YAML → SloSpec: the shipped definitions, the vocabulary, and located errors."""

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tailguard.schemas.errors import SchemaError
from tailguard.schemas.openslo import (
    SloConfigError,
    bundled_slos,
    default_slos,
    load_slos,
    parse_slos,
)
from tailguard.streams import Thresholds
from tailguard.streams.burn import SLO_PERIOD_MS, Selector, SloSpec, thresholds_for

DAY_MS = 86_400_000

THRESHOLD_SLO = """\
apiVersion: openslo/v1
kind: SLO
metadata:
  name: ttft
spec:
  service: chat
  indicator:
    metadata:
      name: ttft
    spec:
      thresholdMetric:
        metricSource:
          type: tailguard
          spec:
            sli: ttft_ms
  timeWindow:
    - duration: 30d
      isRolling: true
  budgetingMethod: Occurrences
  objectives:
    - op: lte
      value: 800
      target: 0.99
"""

RATIO_SLO = """\
apiVersion: openslo/v1
kind: SLO
metadata:
  name: fast
spec:
  service: chat
  indicator:
    metadata:
      name: fast
    spec:
      ratioMetric:
        counter: true
        good:
          metricSource:
            type: tailguard
            spec:
              sli: ttft_ms
              threshold_ms: 300
        total:
          metricSource:
            type: tailguard
            spec:
              sli: ttft_ms
  timeWindow:
    - duration: 30d
      isRolling: true
  budgetingMethod: Occurrences
  objectives:
    - target: 0.95
"""


def line_of(text: str, marker: str) -> int:
    """1-based number of the first line of ``text`` containing ``marker``."""
    for number, line in enumerate(text.splitlines(), start=1):
        if marker in line:
            return number
    raise AssertionError(f"{marker!r} not in the text")


def change(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# ------------------------------------------------------------------ shipped definitions


def test_defaults_are_the_documented_slos() -> None:
    """The default SLOs: TTFT 99 % ≤ 800 ms, ITL 99 % of gaps ≤ 120 ms, composite ≥ 0.99,
    success 99.2 %."""
    specs = {s.name: s for s in default_slos()}
    # display names and descriptions are prose: compare everything else
    assert {n: replace(s, display_name="", description="") for n, s in specs.items()} == {
        "ttft-p99": SloSpec(name="ttft-p99", sli="ttft_ms", target=0.99, ttft_ms=800.0),
        "itl-p99": SloSpec(name="itl-p99", sli="itl_ms", target=0.99, itl_ms=120.0),
        "composite": SloSpec(
            name="composite",
            sli="composite",
            target=0.99,
            ttft_ms=800.0,
            itl_ms=120.0,
            ttft_weight=0.7,
            itl_weight=0.3,
        ),
        "success-rate": SloSpec(name="success-rate", sli="success", target=0.992),
    }
    for spec in specs.values():
        assert spec.window_ms == SLO_PERIOD_MS
        assert spec.description and spec.display_name


def test_the_defaults_count_at_the_default_ingest_thresholds() -> None:
    assert thresholds_for(default_slos()) == Thresholds()


def test_article_examples_are_a_300_ms_ttft_guardrail_and_800_ms_e2e_for_short_completions() -> (
    None
):
    specs = {s.name: s for s in bundled_slos("article-examples.yaml")}
    guardrail = specs["ttft-p95-guardrail"]
    assert (guardrail.sli, guardrail.target, guardrail.ttft_ms) == ("ttft_ms", 0.95, 300.0)
    assert guardrail.selector == Selector(service=("chat-ab",))
    e2e = specs["e2e-p95-short"]
    assert (e2e.sli, e2e.target, e2e.e2e_ms) == ("e2e_ms", 0.95, 800.0)
    assert e2e.applies_to("autocomplete", "any-model")
    assert not e2e.applies_to("chat", "any-model")


def test_the_shipped_files_load_from_their_path_too() -> None:
    folder = Path(__file__).resolve().parents[3] / "schemas" / "slos"
    assert load_slos(folder / "defaults.yaml") == default_slos()
    assert load_slos(str(folder / "article-examples.yaml")) == bundled_slos("article-examples.yaml")


def test_an_unknown_bundled_file_is_refused() -> None:
    with pytest.raises(SloConfigError, match=r"defaults\.yaml"):
        bundled_slos("nope.yaml")


# ------------------------------------------------------------------ the vocabulary


def test_a_threshold_metric_takes_its_threshold_from_the_objective() -> None:
    (spec,) = parse_slos(THRESHOLD_SLO, "t.yaml")
    assert spec == SloSpec(
        name="ttft", sli="ttft_ms", target=0.99, ttft_ms=800.0, selector=Selector(("chat",))
    )
    assert spec.source == f"t.yaml:{line_of(THRESHOLD_SLO, '- op: lte')}"


def test_a_good_over_total_ratio_takes_its_threshold_from_the_good_events() -> None:
    (spec,) = parse_slos(RATIO_SLO)
    assert (spec.sli, spec.ttft_ms, spec.target) == ("ttft_ms", 300.0, 0.95)


def test_bad_over_total_is_the_complement_of_good_over_total() -> None:
    bad = change(RATIO_SLO, "        good:", "        bad:")
    bad = change(bad, "threshold_ms: 300", "threshold_ms: 300\n              op: gt")
    assert parse_slos(bad) == parse_slos(RATIO_SLO)


@pytest.mark.parametrize(
    ("sli", "extra", "fields"),
    [
        ("success", "", {}),
        ("goodput", "", {}),
        (
            "goodput",
            "ttft_threshold_ms: 500\n              tpot_threshold_ms: 50\n"
            "              e2e_threshold_ms: 9000",
            {"ttft_ms": 500.0, "itl_ms": 50.0, "e2e_ms": 9000.0},
        ),
        (
            "composite",
            "ttft_weight: 0.6\n              itl_weight: 0.4\n              itl_threshold_ms: 100",
            {"ttft_weight": 0.6, "itl_weight": 0.4, "itl_ms": 100.0},
        ),
        ("itl_ms", "threshold_ms: 120", {"itl_ms": 120.0}),
        ("e2e_ms", "threshold_ms: 800\n              op: lt", {"e2e_ms": 800.0, "op": "lt"}),
    ],
)
def test_every_ratio_sli_of_the_vocabulary_loads(
    sli: str, extra: str, fields: dict[str, float]
) -> None:
    text = RATIO_SLO.replace("sli: ttft_ms", f"sli: {sli}")
    text = (
        change(text, "threshold_ms: 300", extra)
        if extra
        else change(text, "\n              threshold_ms: 300", "")
    )
    (spec,) = parse_slos(text)
    assert spec == SloSpec(
        name="fast", sli=sli, target=0.95, selector=Selector(("chat",)), **fields
    )  # type: ignore[arg-type]


def test_labels_select_models_variants_and_tenants_by_glob_or_list() -> None:
    text = change(
        THRESHOLD_SLO,
        "  name: ttft\n",
        "  name: ttft\n  labels:\n    model: 'llama-*'\n    tenant: [acme, globex]\n    team: x\n",
    )
    (spec,) = parse_slos(text)
    assert spec.selector == Selector(
        service=("chat",), model=("llama-*",), tenant=("acme", "globex")
    )
    assert spec.applies_to("chat", "llama-3-8b", "default", "acme")
    assert not spec.applies_to("chat", "llama-3-8b", "default", "initech")


def test_several_documents_several_objectives_target_percent_and_indicator_ref() -> None:
    text = (
        THRESHOLD_SLO
        + "    - op: lt\n      value: 1500\n      targetPercent: 99.9\n"
        + "---\napiVersion: openslo/v1\nkind: Service\nmetadata:\n  name: chat\nspec: {}\n"
        + "---\n"
        + """\
apiVersion: openslo/v1
kind: SLI
metadata:
  name: errors
spec:
  ratioMetric:
    bad:
      metricSource: {type: tailguard, spec: {sli: success}}
    total:
      metricSource: {type: tailguard, spec: {sli: success}}
---
apiVersion: openslo/v1
kind: SLO
metadata:
  name: success
spec:
  service: "*"
  indicatorRef: errors
  timeWindow: [{duration: 4w, isRolling: true}]
  budgetingMethod: Occurrences
  objectives: [{target: 0.999}]
"""
    )
    specs = parse_slos(text)
    assert [(s.name, s.sli, s.target, s.threshold_ms, s.op) for s in specs] == [
        ("ttft/1", "ttft_ms", 0.99, 800.0, "lte"),
        ("ttft/2", "ttft_ms", pytest.approx(0.999), 1500.0, "lt"),
        ("success", "success", 0.999, None, "lte"),
    ]
    assert specs[2].window_ms == 28 * DAY_MS


# ------------------------------------------------------------------ errors


def test_slo_config_error_is_a_schema_error_and_a_value_error() -> None:
    assert issubclass(SloConfigError, SchemaError)
    assert issubclass(SloConfigError, ValueError)


ERRORS = [
    # (name, base, old, new, marker of the line at fault, message part)
    (
        "yaml",
        THRESHOLD_SLO,
        "      value: 800",
        "      value: [800",
        "target: 0.99",
        "not valid YAML",
    ),
    ("sli", THRESHOLD_SLO, "sli: ttft_ms", "sli: latency", "sli: latency", "unknown sli 'latency'"),
    ("tpot", THRESHOLD_SLO, "sli: ttft_ms", "sli: tpot_ms", "sli: tpot_ms", "goodput"),
    ("op", THRESHOLD_SLO, "op: lte", "op: gte", "op: gte", "operator 'gte'"),
    (
        "op-good",
        RATIO_SLO,
        "threshold_ms: 300",
        "threshold_ms: 300\n              op: gt",
        "op: gt",
        "operator 'gt'",
    ),
    ("budgeting", THRESHOLD_SLO, "Occurrences", "Timeslices", "Timeslices", "unsupported"),
    (
        "budgeting-unknown",
        THRESHOLD_SLO,
        "Occurrences",
        "Events",
        "Events",
        "unknown budgetingMethod",
    ),
    ("api", THRESHOLD_SLO, "openslo/v1", "openslo/v1alpha", "openslo/v1alpha", "apiVersion"),
    ("kind", THRESHOLD_SLO, "kind: SLO", "kind: AlertPolicy", "kind: AlertPolicy", "not supported"),
    (
        "calendar",
        THRESHOLD_SLO,
        "isRolling: true",
        "isRolling: false",
        "isRolling: false",
        "isRolling: true",
    ),
    ("months", THRESHOLD_SLO, "duration: 30d", "duration: 1M", "duration: 1M", "calendar units"),
    (
        "duration",
        THRESHOLD_SLO,
        "duration: 30d",
        "duration: 30 days",
        "duration: 30 days",
        "duration",
    ),
    ("target", THRESHOLD_SLO, "target: 0.99", "target: 1.0", "target: 1.0", "out of range"),
    ("target-type", THRESHOLD_SLO, "target: 0.99", "target: high", "target: high", "number"),
    ("no-target", THRESHOLD_SLO, "      target: 0.99\n", "", "- op: lte", "target"),
    ("value", THRESHOLD_SLO, "value: 800", "value: -5", "value: -5", "out of range"),
    (
        "source",
        THRESHOLD_SLO,
        "type: tailguard",
        "type: Prometheus",
        "type: Prometheus",
        "type: tailguard",
    ),
    (
        "typo",
        RATIO_SLO,
        "threshold_ms: 300",
        "treshold_ms: 300",
        "treshold_ms",
        "unknown key 'treshold_ms'",
    ),
    (
        "threshold-success",
        THRESHOLD_SLO,
        "sli: ttft_ms",
        "sli: success",
        "sli: success",
        "ratioMetric",
    ),
    (
        "mismatch",
        RATIO_SLO,
        "              sli: ttft_ms\n  time",
        "              sli: e2e_ms\n  time",
        "sli: e2e_ms",
        "same SLI",
    ),
    (
        "ratio-value",
        RATIO_SLO,
        "    - target: 0.95",
        "    - target: 0.95\n      value: 3",
        "value: 3",
        "only a target",
    ),
    (
        "duplicate-key",
        THRESHOLD_SLO,
        "      target: 0.99",
        "      target: 0.99\n      value: 900",
        "value: 900",
        "repeats the key 'value'",
    ),
    ("no-service", THRESHOLD_SLO, "  service: chat\n", "", "spec:", "needs 'service'"),
    (
        "name",
        THRESHOLD_SLO,
        "name: ttft\nspec",
        "name: 'ttft p99'\nspec",
        "'ttft p99'",
        "metadata.name",
    ),
    (
        "indicator-ref",
        THRESHOLD_SLO,
        "  indicator:\n",
        "  indicatorRef: nope\n  indicator_unused:\n",
        "indicatorRef: nope",
        "names no kind: SLI",
    ),
]


@pytest.mark.parametrize(
    ("base", "old", "new", "marker", "message"),
    [case[1:] for case in ERRORS],
    ids=[case[0] for case in ERRORS],
)
def test_a_bad_definition_names_the_file_and_the_line_at_fault(
    base: str, old: str, new: str, marker: str, message: str
) -> None:
    text = change(base, old, new)
    with pytest.raises(SloConfigError) as caught:
        parse_slos(text, "slos.yaml")
    assert str(caught.value).startswith(f"slos.yaml:{line_of(text, marker)}: "), str(caught.value)
    assert message in str(caught.value)


def test_a_name_defined_twice_is_refused_at_the_second_document() -> None:
    text = THRESHOLD_SLO + "---\n" + THRESHOLD_SLO
    with pytest.raises(SloConfigError, match=r"^x.yaml:25: SLO name 'ttft' is defined twice"):
        parse_slos(text, "x.yaml")


@pytest.mark.parametrize("text", ["", "# nothing\n", "---\n...\n"])
def test_a_file_without_slos_is_refused(text: str) -> None:
    with pytest.raises(SloConfigError, match="no kind: SLO"):
        parse_slos(text, "empty.yaml")


def test_load_errors_carry_the_file_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(change(THRESHOLD_SLO, "sli: ttft_ms", "sli: qps"))
    with pytest.raises(
        SloConfigError, match=rf"^{path}:{line_of(THRESHOLD_SLO, 'sli:')}: unknown sli"
    ):
        load_slos(path)
    with pytest.raises(SloConfigError, match="cannot read"):
        load_slos(tmp_path / "missing.yaml")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"apiVersion: openslo/v1\nkind: \xff\n")
    with pytest.raises(SloConfigError, match=rf"^{binary}:2: not UTF-8"):
        load_slos(binary)


# ------------------------------------------------------------------ round trip


@given(
    sli=st.sampled_from(["ttft_ms", "itl_ms", "e2e_ms"]),
    op=st.sampled_from(["lte", "lt"]),
    value=st.integers(1, 60_000),
    target=st.integers(1, 9_999).map(lambda n: n / 10_000),
    days=st.integers(1, 90),
    service=st.sampled_from(["chat", "*", "chat-*", "search"]),
)
def test_any_threshold_slo_written_as_openslo_loads_back_the_same(
    sli: str, op: str, value: int, target: float, days: int, service: str
) -> None:
    text = (
        THRESHOLD_SLO.replace("sli: ttft_ms", f"sli: {sli}")
        .replace("op: lte", f"op: {op}")
        .replace("value: 800", f"value: {value}")
        .replace("target: 0.99", f"target: {target!r}")
        .replace("duration: 30d", f"duration: {days}d")
        .replace("service: chat", f"service: '{service}'")
    )
    (spec,) = parse_slos(text)
    assert spec == SloSpec(
        name="ttft",
        sli=sli,
        target=target,
        op=op,
        window_ms=days * DAY_MS,
        selector=Selector(service=(service,)),
        **{sli: float(value)},  # type: ignore[arg-type]
    )
