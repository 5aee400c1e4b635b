"""The worker's telemetry registry, its Prometheus exposition and the dashboard page (no broker)."""

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tailguard.agents import telemetry as telemetry_module
from tailguard.agents.internal import partition_for, series_key
from tailguard.agents.metrics import make_registry, order_guard_counts, render
from tailguard.agents.offsets import InOrderGuard, VerdictKind
from tailguard.agents.settings import Settings
from tailguard.agents.stats import WorkerStats
from tailguard.agents.telemetry import MAX_LABEL_CHARS, Telemetry
from tailguard.agents.web import dashboard_html
from tailguard.streams.breach import BreachState
from tailguard.streams.burn import Verdict

SERIES = ("chat", "llama", "default", "default")
KEY = series_key(*SERIES)


def snapshot(window: str = "1m", *, final: bool = True, p99: float = 900.0) -> dict[str, Any]:
    row = {"p50": 100.0, "p90": 200.0, "p95": 300.0, "p99": p99, "p999": 1_000.0, "count": 50}
    return {
        "window": window,
        "window_end_ms": 120_000,
        "final": final,
        "count": 50,
        "errors": 1,
        "success_rate": 0.98,
        "ttft_compliance": 0.9,
        "itl_compliance": 1.0,
        "slo_compliance": 0.93,
        "goodput_rps": 0.7,
        "ttft_ms": row,
        "itl_ms": {**row, "p99": None},
    }


def breach(state: str, breach_id: str = "b1", series: tuple[str, ...] = SERIES) -> dict[str, Any]:
    service, model, variant, tenant = series
    return {
        "breach_id": breach_id,
        "state": state,
        "kind": "burn_rate",
        "severity": "page",
        "slo": "ttft-p99",
        "series": {"service": service, "model": model, "variant": variant, "tenant": tenant},
        "at_ms": 600_000,
        "opened_ms": 540_000,
        "burn_rates": {"1h": 20.0, "5m": 60.0},
        "attribution": [{"cause": "cache_miss", "share": 0.8}],
        "gpu": [{"host": "n1", "gpu": 0, "known": True, "util_gpu_pct": 97.0, "age_ms": 1_000}],
        "exemplars": [f"{i:032x}" for i in range(8)],
    }


def families(t: Telemetry, lag: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    text = render(make_registry(t, lambda: lag or [])).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_a_final_snapshot_becomes_gauges_in_seconds_per_window_metric_and_percentile() -> None:
    t = Telemetry()
    t.observe_sli(SERIES, "1m", snapshot())
    t.observe_sli(SERIES, "5m", snapshot("5m", final=False))  # provisional: dashboard only
    fams = families(t)
    latency = {
        (s.labels["window"], s.labels["metric"], s.labels["percentile"]): s.value
        for s in fams["tailguard_sli_latency_seconds"].samples
    }
    assert latency[("1m", "ttft", "p99")] == pytest.approx(0.9)
    assert ("1m", "itl", "p99") not in latency, "a percentile without samples is left out"
    assert not [k for k in latency if k[0] == "5m"], "only final snapshots are exported"
    (compliance,) = fams["tailguard_sli_slo_compliance_ratio"].samples
    assert compliance.value == 0.93 and compliance.labels["service"] == "chat"
    assert t.view()["series"][0]["windows"]["5m"]["final"] is False


def test_a_snapshot_given_as_its_published_json_is_shown_as_its_payload() -> None:
    as_dict, as_json = Telemetry(), Telemetry(max_series=1)
    as_dict.observe_sli(SERIES, "1m", snapshot())
    as_json.observe_sli(SERIES, "1m", json.dumps(snapshot()).encode())
    other = ("other", "m", "default", "default")
    as_json.observe_sli(other, "1m", b"not json: a series not shown is not decoded")
    assert as_json.view()["series"] == as_dict.view()["series"]
    assert as_json.series_refused == 1


def test_burn_rates_and_the_breach_lifecycle_are_exported_per_series_and_slo() -> None:
    t = Telemetry()
    verdict = Verdict(
        slo="ttft-p99",
        severity="page",
        burn_rates={"5m": 60.0, "1h": 20.0, "3d": math.inf},
        budget_remaining=0.25,
    )
    state = BreachState(series_key=KEY, slo="ttft-p99", breach_id="b1", severity="page")
    t.observe_slo(KEY, "ttft-p99", verdict, state, 600_000)
    t.observe_breach(breach("opened"))
    fams = families(t)
    burn = {s.labels["window"]: s.value for s in fams["tailguard_slo_burn_rate"].samples}
    assert burn == {"5m": 60.0, "1h": 20.0}, "non-finite rates are left out"
    assert fams["tailguard_slo_breach_state"].samples[0].value == 2
    assert fams["tailguard_slo_budget_remaining_ratio"].samples[0].value == 0.25
    (open_,) = fams["tailguard_breach_open"].samples
    assert open_.labels["severity"] == "page" and open_.value == 1
    closed = BreachState(series_key=KEY, slo="ttft-p99")
    t.observe_slo(KEY, "ttft-p99", Verdict(slo="ttft-p99", severity=None), closed, 900_000)
    t.observe_breach(breach("resolved"))
    fams = families(t)
    assert not fams["tailguard_breach_open"].samples
    transitions = {
        s.labels["state"]: s.value
        for s in fams["tailguard_breach_transitions"].samples
        if s.name.endswith("_total")
    }
    assert transitions == {"opened": 1.0, "resolved": 1.0}
    view = t.view()
    assert view["breaches"]["open"] == [] and view["breaches"]["resolved"][0]["breach_id"] == "b1"


def test_the_series_cap_bounds_cardinality_and_stale_series_free_their_slot() -> None:
    now = [1_000.0]
    t = Telemetry(max_series=2, stale_after_s=60.0, clock=lambda: now[0])
    for service in ("a", "b", "c"):
        t.observe_sli((service, "m", "default", "default"), "1m", snapshot())
    assert len(t) == 2 and t.series_refused == 1
    fams = families(t)
    assert fams["tailguard_metrics_series_refused"].samples[0].value == 1
    services = {s.labels["service"] for s in fams["tailguard_sli_requests"].samples}
    assert services == {"a", "b"}
    now[0] += 61.0
    t.observe_sli(("a", "m", "default", "default"), "1m", snapshot())  # a stays fresh
    assert t.prune() == 1
    t.observe_sli(("c", "m", "default", "default"), "1m", snapshot())
    assert {k.split("|")[0] for k, _, _ in t.series_items()} == {"a", "c"}


def test_long_label_values_are_cut() -> None:
    t = Telemetry()
    t.observe_sli(("s" * 500, "m", "default", "default"), "1m", snapshot())
    fams = families(t)
    (sample,) = fams["tailguard_sli_requests"].samples
    assert len(sample.labels["service"]) == MAX_LABEL_CHARS


def test_worker_counters_dead_letters_and_lag_are_exported() -> None:
    stats = WorkerStats(
        messages=3, events_valid=600, events_applied=590, late=10, batches=2, gc_seconds=0.25
    )
    stats.deadletters["malformed_json"] += 2
    t = Telemetry(stats=stats)
    lag = [
        {
            "topic": "tailguard.inference",
            "partition": 1,
            "highwater": 90,
            "committed": 40,
            "lag": 50,
        }
    ]
    fams = families(t, lag)
    assert fams["tailguard_events_processed"].samples[0].value == 590
    assert fams["tailguard_events_late"].samples[0].value == 10
    assert fams["tailguard_ingest_batches"].samples[0].value == 2
    assert fams["tailguard_gc_seconds"].samples[0].value == 0.25
    (dead,) = fams["tailguard_deadletters"].samples
    assert dead.labels == {"reason": "malformed_json"} and dead.value == 2
    (lagged,) = fams["tailguard_consumer_lag_messages"].samples
    assert lagged.labels == {"topic": "tailguard.inference", "partition": "1"}
    assert lagged.value == 50


TP = ("tailguard.inference", 0)


def test_the_in_order_guards_counters_are_exported() -> None:
    """Rebalance churn shows on /metrics: records re-read after a seek, holes, gaps."""
    guard = InOrderGuard()
    guard.sought(TP, 10)
    assert guard.admit(TP, 5).kind is VerdictKind.DROP  # fetched before the seek
    assert guard.admit(TP, 12).kind is VerdictKind.SEEK  # a hole: 10 and 11 are missing
    app = SimpleNamespace(consumer=SimpleNamespace(order_guard=guard))  # what the worker reads
    text = render(make_registry(Telemetry(), guard=lambda: order_guard_counts(app))).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["tailguard_consumer_stale_records_dropped"].samples[0].value == 1
    assert fams["tailguard_consumer_holes_reread"].samples[0].value == 1
    assert fams["tailguard_consumer_gaps_acknowledged"].samples[0].value == 0
    assert "# TYPE tailguard_consumer_holes_reread_total counter" in text


def test_metric_names_follow_prometheus_conventions() -> None:
    t = Telemetry()
    t.observe_sli(SERIES, "1m", snapshot())
    text = render(make_registry(t)).decode()
    names = set(re.findall(r"^# TYPE (\S+) (\S+)", text, flags=re.M))
    for name, kind in names:
        assert name.startswith(("tailguard_", "process_")), name
        assert "_ms" not in name, f"{name}: seconds, not milliseconds"
        if kind == "counter":
            assert name.endswith("_total"), name


def test_release_decisions_are_kept_once_per_event_and_summarised_per_experiment() -> None:
    t = Telemetry()
    decision = {
        "event_id": "e1",
        "experiment": "exp-42",
        "decision": "rollback",
        "arm": "canary",
        "reasons": ["ttft p95 +40 %"],
        "weights": {"control": 1.0, "canary": 0.0},
        "ts_ms": 5,
    }
    t.record_release(decision)
    t.record_release(decision)  # re-sent after a crash: same event_id
    t.record_experiment("exp-42", status="running", arms=["control", "canary"])
    view = t.view()
    assert len(view["decisions"]) == 1
    (row,) = view["experiments"]
    assert row["decision"] == "rollback" and row["status"] == "running"
    assert row["weights"] == {"control": 1.0, "canary": 0.0} and row["decisions"] == 1
    fams = families(t)
    (count,) = [s for s in fams["tailguard_release_decisions"].samples if s.name.endswith("_total")]
    assert count.labels == {"decision": "rollback"} and count.value == 1


def test_module_functions_feed_the_active_worker_registry() -> None:
    t = telemetry_module.activate(Telemetry())
    telemetry_module.record_release({"experiment": "exp-1", "decision": "hold"})
    telemetry_module.record_breach(breach("opened", "b9"))
    assert telemetry_module.active() is t
    assert t.experiments["exp-1"]["decision"] == "hold" and "b9" in t.open_breaches


def test_partitions_that_moved_away_drop_their_series_and_breaches() -> None:
    t = Telemetry(partitions=4)
    other = ("other", "m", "default", "default")
    while partition_for(series_key(*other), 4) == partition_for(KEY, 4):
        other = (other[0] + "x", *other[1:])
    t.observe_sli(SERIES, "1m", snapshot())
    t.observe_sli(other, "1m", snapshot())
    t.observe_breach(breach("opened"))
    t.forget_partitions({partition_for(KEY, 4)})
    assert [k for k, _, _ in t.series_items()] == [series_key(*other)]
    assert not t.open_breaches


def test_a_breach_open_since_before_a_restart_shows_without_its_evidence() -> None:
    t = Telemetry()
    verdict = Verdict(slo="ttft-p99", severity=None, burn_rates={"1h": 3.0})
    state = BreachState(series_key=KEY, slo="ttft-p99", breach_id="old", severity="ticket")
    t.observe_slo(KEY, "ttft-p99", verdict, state, 600_000)
    view = t.view()
    (b,) = view["breaches"]["open"]
    assert b["breach_id"] == "old" and b["tracked"] is False and b["severity"] == "ticket"
    assert view["series"][0]["breached"]


def test_the_view_lists_breached_series_first_and_trims_exemplars() -> None:
    t = Telemetry()
    t.observe_sli(("healthy", "m", "default", "default"), "1m", snapshot())
    t.observe_sli(SERIES, "1m", snapshot())
    t.observe_breach(breach("opened"))
    view = t.view()
    assert [r["series"]["service"] for r in view["series"]] == ["chat", "healthy"]
    assert len(view["breaches"]["open"][0]["exemplars"]) == 5


def test_the_dashboard_page_is_self_contained() -> None:
    page = dashboard_html()
    assert "/dashboard/state" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), (
        "no CDN, no remote assets"
    )
    assert "<script src" not in page and "@import" not in page


def test_a_web_port_in_the_environment_enables_the_web_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TAILGUARD_WEB_PORT", "6099")
    monkeypatch.setenv("TAILGUARD_METRICS_MAX_SERIES", "7")
    settings = Settings.from_env()
    assert settings.web_enabled and settings.web_port == 6099 and settings.metrics_max_series == 7
    assert Settings.from_env(web_bind="0.0.0.0").web_bind == "0.0.0.0"


def test_the_grafana_dashboard_queries_only_metrics_the_worker_exports() -> None:
    path = Path(__file__).resolve().parents[3] / "infra" / "grafana" / "tailguard-dashboard.json"
    dashboard = json.loads(path.read_text())
    stats = WorkerStats()
    stats.deadletters["malformed_json"] += 1
    t = Telemetry(stats=stats)
    t.observe_sli(SERIES, "1m", snapshot())
    t.observe_slo(
        KEY,
        "ttft-p99",
        Verdict(slo="ttft-p99", severity="page", burn_rates={"1h": 20.0}, budget_remaining=0.5),
        BreachState(series_key=KEY, slo="ttft-p99", breach_id="b1", severity="page"),
        600_000,
    )
    t.observe_breach(breach("opened"))
    t.record_release({"experiment": "e", "decision": "hold"})
    lag = [{"topic": "t", "partition": 0, "highwater": 1, "committed": 0, "lag": 1}]
    exported = {sample.name for family in families(t, lag).values() for sample in family.samples}
    used: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            used.update(re.findall(r"\b((?:tailguard|process)_[a-z_]+)", target["expr"]))
    for var in dashboard["templating"]["list"]:
        used.update(re.findall(r"\b(tailguard_[a-z_]+)", str(var.get("query", ""))))
    assert used and used <= exported, sorted(used - exported)
