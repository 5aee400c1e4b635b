"""Terminal views: ``tailguard tail`` (follow a topic) and the live SLI table."""

import json
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition
from rich.console import Console
from rich.live import Live
from rich.table import Table

from tailguard.catalogue import BREACHES, SLI, default_prefix
from tailguard.kafka_admin import ensure_broker

__all__ = ["follow", "sli_table", "tail", "watch_sli"]


def follow(
    broker: str,
    topic: str,
    *,
    from_beginning: bool = False,
    timeout_s: float | None = None,
    idle_exit_s: float | None = None,
) -> Iterator[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]:
    """Yield ``(key, value, headers)`` of every record of ``topic``, all partitions.

    Stops after ``timeout_s`` in total, or ``idle_exit_s`` without a record.
    """
    admin = ensure_broker(broker)
    meta = admin.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None:
        msg = f"topic {topic} does not exist; run `tailguard topics create` first"
        raise SystemExit(msg)
    consumer = Consumer(
        {
            "bootstrap.servers": broker,
            "group.id": f"tailguard-tail-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    start = OFFSET_BEGINNING if from_beginning else OFFSET_END
    consumer.assign([TopicPartition(topic, p, start) for p in meta.partitions])
    began = last = time.monotonic()
    try:
        while True:
            now = time.monotonic()
            if timeout_s is not None and now - began > timeout_s:
                return
            if idle_exit_s is not None and now - last > idle_exit_s:
                return
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise SystemExit(f"consumer error: {msg.error()}")
            last = time.monotonic()
            yield msg.key(), msg.value(), list(msg.headers() or [])
    finally:
        consumer.close()


def tail(broker: str, topic: str, *, from_beginning: bool, limit: int | None) -> None:
    """Pretty-print records of ``topic`` as they arrive."""
    console = Console()
    records = follow(broker, topic, from_beginning=from_beginning)
    for n, (key, value, _headers) in enumerate(records, start=1):
        try:
            body: Any = json.loads(value or b"null")
            console.print_json(data=body)
        except (ValueError, UnicodeDecodeError):
            console.print(repr(value))
        console.print(f"[dim]key={key!r}[/dim]")
        if limit is not None and n >= limit:
            return


def _ms(value: Any) -> str:
    return "–" if value is None else f"{value:,.0f}"


def sli_table(latest: dict[str, dict[str, Any]], window: str) -> Table:
    """A rich table of the latest snapshot per series for ``window``."""
    table = Table(title=f"tailguard · SLIs per series · window {window}", expand=True)
    for col in (
        "series",
        "n",
        "err",
        "TTFT p50",
        "TTFT p95",
        "TTFT p99",
        "ITL p99",
        "E2E p95",
        "SLO compl.",
        "goodput/s",
    ):
        table.add_column(col, justify="left" if col == "series" else "right")
    for key in sorted(latest):
        s = latest[key]
        compliance = s.get("slo_compliance", 1.0)
        style = "red" if compliance < 0.99 else ("yellow" if compliance < 0.999 else "green")
        table.add_row(
            key,
            str(s.get("count", 0)),
            str(s.get("errors", 0)),
            _ms(s["ttft_ms"].get("p50")),
            _ms(s["ttft_ms"].get("p95")),
            _ms(s["ttft_ms"].get("p99")),
            _ms(s["itl_ms"].get("p99")),
            _ms(s["e2e_ms"].get("p95")),
            f"[{style}]{compliance:.2%}[/{style}]",
            f"{s.get('goodput_rps', 0.0):.1f}",
        )
    return table


def watch_sli(
    broker: str, *, window: str = "1m", duration_s: float | None = None
) -> dict[str, dict[str, Any]]:
    """Live table of the newest snapshot per series; returns the last ones seen."""
    latest: dict[str, dict[str, Any]] = {}
    with Live(sli_table(latest, window), refresh_per_second=2) as live:
        for _key, value, _headers in follow(broker, default_prefix() + SLI, timeout_s=duration_s):
            snap = json.loads(value or b"{}")
            if snap.get("window") != window:
                continue
            s = snap["series"]
            name = f"{s['service']}/{s['model']}/{s['variant']}/{s['tenant']}"
            prev = latest.get(name)
            if prev is None or snap["window_end_ms"] >= prev["window_end_ms"]:
                latest[name] = snap
                live.update(sli_table(latest, window))
    return latest


def report(broker: str, *, idle_s: float = 5.0, window: str = "1m") -> dict[str, dict[str, Any]]:
    """Summarise every final snapshot of ``window`` on the SLI topic, per series.

    For each series: minutes seen, requests, errors, the best and worst minute's
    TTFT P95 and SLO compliance, and when the worst minute ended.
    """
    rows: dict[str, dict[str, Any]] = {}
    topic = default_prefix() + SLI
    for _key, value, _headers in follow(broker, topic, from_beginning=True, idle_exit_s=idle_s):
        snap = json.loads(value or b"{}")
        if snap.get("window") != window or not snap.get("final"):
            continue
        s = snap["series"]
        name = f"{s['service']}/{s['model']}/{s['variant']}/{s['tenant']}"
        row = rows.setdefault(
            name,
            {
                "minutes": 0,
                "requests": 0,
                "errors": 0,
                "best_p95": None,
                "worst_p95": None,
                "worst_compliance": 1.0,
                "worst_end_ms": None,
            },
        )
        row["minutes"] += 1
        row["requests"] += snap["count"]
        row["errors"] += snap["errors"]
        p95 = snap["ttft_ms"].get("p95")
        if p95 is not None:
            row["best_p95"] = p95 if row["best_p95"] is None else min(row["best_p95"], p95)
            row["worst_p95"] = p95 if row["worst_p95"] is None else max(row["worst_p95"], p95)
        if snap["slo_compliance"] < row["worst_compliance"]:
            row["worst_compliance"] = snap["slo_compliance"]
            row["worst_end_ms"] = snap["window_end_ms"]
    table = Table(title=f"tailguard · report · final {window} windows", expand=True)
    for col in (
        "series",
        "minutes",
        "requests",
        "errors",
        "best TTFT p95",
        "worst TTFT p95",
        "worst SLO compl.",
        "worst minute ended",
    ):
        table.add_column(col, justify="left" if col == "series" else "right")
    for name in sorted(rows):
        r = rows[name]
        when = "–"
        if r["worst_end_ms"] is not None:
            when = time.strftime("%H:%M:%S", time.gmtime(r["worst_end_ms"] / 1000)) + "Z"
        style = "red" if r["worst_compliance"] < 0.99 else "green"
        table.add_row(
            name,
            str(r["minutes"]),
            str(r["requests"]),
            str(r["errors"]),
            _ms(r["best_p95"]),
            _ms(r["worst_p95"]),
            f"[{style}]{r['worst_compliance']:.2%}[/{style}]",
            when,
        )
    _console().print(table)
    return rows


def _gpu_summary(gpus: list[dict[str, Any]]) -> str:
    """``3 GPUs on gpu-node-01 · util ≤ 98% · ≤ 80°C · throttled · 30 s old``."""
    known = [g for g in gpus if g.get("known")]
    if not gpus:
        return ""
    if not known:
        return f"{len(gpus)} GPU(s), no telemetry"
    hosts = sorted({g["host"] for g in known})
    util = max(g.get("util_gpu_pct") or 0 for g in known)
    temp = max(g.get("temp_c") or 0 for g in known)
    age = min(g.get("age_ms", 0) for g in known) / 1000
    throttled = any(g.get("throttle_reasons") for g in known)
    return (
        f"{len(known)} GPU(s) on {','.join(hosts)} · util ≤ {util:.0f}% · ≤ {temp:.0f}°C"
        f"{' · throttled' if throttled else ''} · {age:.0f}s old"
    )


def _console() -> Console:
    """A wide console when output is not a terminal (logs, CI), so tables stay readable."""
    return Console() if sys.stdout.isatty() else Console(width=200)


def breach_report(broker: str, *, idle_s: float = 5.0) -> list[dict[str, Any]]:
    """Print every breach transition on the breaches topic; returns them."""
    topic = default_prefix() + BREACHES
    rows: list[dict[str, Any]] = []
    for _key, value, _headers in follow(broker, topic, from_beginning=True, idle_exit_s=idle_s):
        rows.append(json.loads(value or b"{}"))
    table = Table(title="tailguard · breaches (burn-rate lifecycle)", expand=True)
    for col in (
        "event time",
        "series",
        "slo",
        "state",
        "severity",
        "burn 1h / 5m",
        "budget left",
        "GPUs (util, temp, age)",
    ):
        table.add_column(col)
    for b in rows:
        s = b["series"]
        rates = b.get("burn_rates", {})
        gpus = _gpu_summary(b.get("gpu", [])) or (b.get("gpu_note") or "–")
        colour = {"opened": "red", "resolved": "green"}.get(b["state"], "yellow")
        budget = b.get("budget_remaining")
        table.add_row(
            time.strftime("%H:%M", time.gmtime(b["at_ms"] / 1000)) + "Z",
            f"{s['service']}/{s['model']}/{s['variant']}/{s['tenant']}",
            b["slo"],
            f"[{colour}]{b['state']}[/{colour}]",
            b["severity"],
            f"{rates.get('1h', 0):.1f}× / {rates.get('5m', 0):.1f}×",
            "–" if budget is None else f"{budget:.0%}",
            gpus,
        )
    _console().print(table)
    return rows
