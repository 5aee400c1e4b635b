"""Terminal views: ``tailguard tail`` (follow a topic), the live SLI table and the report."""

import json
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition
from rich.console import Console
from rich.live import Live
from rich.table import Table

from tailguard.catalogue import BREACHES, CAPACITY, RELEASES, SLI, default_prefix
from tailguard.errors import TailguardError
from tailguard.kafka_admin import ensure_broker

if TYPE_CHECKING:
    from tailguard.report import ReportFiles

__all__ = [
    "TopicMissing",
    "TopicRead",
    "breach_report",
    "capacity_line",
    "capacity_report",
    "follow",
    "heatmap_report",
    "read_to_end",
    "release_lines",
    "report",
    "sli_table",
    "tail",
    "watch_capacity",
    "watch_release",
    "watch_sli",
]


class TopicMissing(TailguardError, LookupError):
    """A topic the command reads does not exist."""


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
            record = consumer.poll(0.5)
            if record is None:
                continue
            error = record.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise SystemExit(f"consumer error: {error}")
            last = time.monotonic()
            yield record.key(), record.value(), list(record.headers() or [])
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


def _json_values(broker: str, topic: str, idle_s: float) -> Iterator[dict[str, Any]]:
    for _key, value, _headers in follow(broker, topic, from_beginning=True, idle_exit_s=idle_s):
        yield json.loads(value or b"{}")


def report(
    broker: str,
    *,
    idle_s: float = 5.0,
    window: str = "1m",
    records: Iterable[dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Summarise every final snapshot of ``window`` on the SLI topic, per series.

    For each series: minutes seen, requests, errors, the best and worst minute's
    TTFT P95 and SLO compliance, and when the worst minute ended. ``records``:
    the decoded snapshots when already read (else the topic is followed until
    ``idle_s`` passes without a record).
    """
    rows: dict[str, dict[str, Any]] = {}
    snaps = records if records is not None else _json_values(broker, default_prefix() + SLI, idle_s)
    for snap in snaps:
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


def breach_report(
    broker: str, *, idle_s: float = 5.0, records: Iterable[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Print every breach transition on the breaches topic; returns them.

    ``records``: the decoded transitions when already read.
    """
    if records is None:
        records = _json_values(broker, default_prefix() + BREACHES, idle_s)
    rows: list[dict[str, Any]] = list(records)
    table = Table(title="tailguard · breaches", expand=True)
    for col in (
        "event time",
        "series",
        "kind / slo",
        "state",
        "severity",
        "burn 1h / 5m",
        "budget left",
        "why (share of bad requests; stages by P99 rise)",
        "GPUs (util, temp, age)",
    ):
        table.add_column(col)
    for b in rows:
        s = b["series"]
        rates = b.get("burn_rates", {})
        gpus = _gpu_summary(b.get("gpu", [])) or (b.get("gpu_note") or "–")
        colour = {"opened": "red", "resolved": "green"}.get(b["state"], "yellow")
        budget = b.get("budget_remaining")
        kind = b.get("kind", "burn_rate")
        table.add_row(
            time.strftime("%H:%M", time.gmtime(b["at_ms"] / 1000)) + "Z",
            f"{s['service']}/{s['model']}/{s['variant']}/{s['tenant']}",
            b["slo"] if kind == "burn_rate" else f"{kind}\n{b.get('slo') or ''}",
            f"[{colour}]{b['state']}[/{colour}]",
            b["severity"],
            f"{rates.get('1h', 0):.1f}× / {rates.get('5m', 0):.1f}×" if rates else "–",
            "–" if budget is None else f"{budget:.0%}",
            _why(b),
            gpus,
        )
    _console().print(table)
    return rows


def _why(breach: dict[str, Any]) -> str:
    """Ranked causes and the stages that grew most, in a few words."""
    parts = []
    causes = [
        f"{c['cause']} {c['share']:.0%}"
        for c in breach.get("attribution") or []
        if isinstance(c, dict) and "cause" in c and isinstance(c.get("share"), int | float)
    ]
    if causes:
        parts.append(" → ".join(causes[:3]))
    stages = [
        f"{st['stage']} +{st['increase_ms']:.0f} ms"
        for st in breach.get("stages") or []
        if isinstance(st, dict) and isinstance(st.get("increase_ms"), int | float)
    ]
    if stages and breach.get("state") != "resolved":
        parts.append(", ".join(stages[:3]))
    prompts = [
        f"{p['prompt_version']} {p['bad_share']:.0%}"
        + (f" ({p['prompt_group']})" if p.get("prompt_group") else "")
        for p in breach.get("prompts") or []
        if isinstance(p, dict) and isinstance(p.get("bad_share"), int | float)
    ]
    if prompts and breach.get("state") != "resolved":
        parts.append("prompts: " + ", ".join(prompts[:2]))
    return "\n".join(parts) or "–"


def capacity_line(rec: dict[str, Any]) -> str:
    """One ``tailguard.capacity.v1`` record in a line: what was decided, from what."""
    when, where, what = _capacity_parts(rec)
    return f"{when}  {where:<22} {rec.get('kind', '?'):<13} {rec.get('decision', '?'):<11} {what}"


def _capacity_parts(rec: dict[str, Any]) -> tuple[str, str, str]:
    """(event time, deployment and subject, the evidence in words) of a capacity record."""
    ev = rec.get("evidence") or {}
    dep = rec.get("deployment") or {}
    kind, decision = rec.get("kind", "?"), rec.get("decision", "?")
    subject = ""
    if kind == "knee":
        what = (
            f"knee at concurrency {ev.get('knee_concurrency')} "
            f"(P95 {_ms(ev.get('knee_p95_ms'))} ms, {ev.get('samples')} intervals)"
        )
    elif kind == "scale":
        up = decision == "scale_up" or (
            decision == "hold"
            and isinstance(ev.get("up_threshold"), int | float)
            and (ev.get("concurrency") or 0) >= ev["up_threshold"]
        )
        factor = ev.get("capacity_factor")
        what = (
            f"concurrency {ev.get('concurrency')} {'≥' if up else '<'} "
            f"{ev.get('up_threshold') if up else ev.get('down_threshold')}"
            f" (knee {ev.get('knee')}), util {ev.get('util_pct')}%, mem {ev.get('mem_fraction')}"
            + (f" → capacity ×{factor:.2f}" if isinstance(factor, int | float) else "")
            + f" [{rec.get('reason')}]"
        )
    elif kind == "breaker":
        subject = f"expert {rec.get('expert')}"
        health = (
            f"cool-down of {ev.get('cooldown_ms', 0) / 1000:.0f} s over, probing"
            if decision == "half_open"
            else f"error rate {ev.get('error_rate', 0):.0%}, P99 {_ms(ev.get('p99_ms'))} ms "
            f"over {ev.get('requests')} requests"
        )
        what = (
            f"{ev.get('before')} → {decision}: {health}; "
            f"fallback takes {ev.get('fallback_share', 0):.1%}"
        )
    elif kind == "rag_threshold":
        subject = f"index {rec.get('index')}"
        prev = ev.get("previous")
        what = (
            f"threshold {'' if prev is None else f'{prev:.3f} → '}{ev.get('threshold', 0):.3f} "
            f"(q{ev.get('quantile')} of Beta({ev.get('alpha', 0):.1f}, {ev.get('beta', 0):.1f})"
            + (f", band ±{ev['band']:.3f}" if prev is not None and ev.get("band") else "")
            + ")"
        )
    elif kind == "warmup":
        subject = f"instance {rec.get('instance')}"
        what = (
            f"TTFT p50 {_ms(ev.get('before_ttft_p50_ms'))} ms during warm-up → "
            f"{_ms(ev.get('after_ttft_p50_ms'))} ms after"
        )
    else:
        what = rec.get("reason") or ""
    when = time.strftime("%H:%M:%S", time.gmtime(rec.get("ts_ms", 0) / 1000)) + "Z"
    where = f"{dep.get('service')}/{dep.get('model')}" + (f" {subject}" if subject else "")
    return when, where, what


def watch_capacity(
    broker: str,
    *,
    timeout_s: float,
    done: Callable[[list[dict[str, Any]]], bool] | None = None,
    match: Callable[[dict[str, Any]], bool] | None = None,
) -> list[dict[str, Any]]:
    """Print every ``tailguard.capacity`` record (that ``match`` accepts) as it arrives,
    from the beginning, until ``done(records)`` holds or ``timeout_s`` passes; returns them."""
    out = _console()
    records: list[dict[str, Any]] = []
    for _key, value, _headers in follow(
        broker, default_prefix() + CAPACITY, from_beginning=True, timeout_s=timeout_s
    ):
        rec = json.loads(value or b"{}")
        if match is not None and not match(rec):
            continue
        records.append(rec)
        out.print("  " + capacity_line(rec), highlight=False, soft_wrap=True)
        if done is not None and done(records):
            break
    return records


def capacity_report(
    broker: str, *, idle_s: float = 5.0, records: Iterable[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Print the capacity decisions as a table (holds left out, and of each
    deployment's knee updates only the latest); returns the rows."""
    if records is None:
        records = _json_values(broker, default_prefix() + CAPACITY, idle_s)
    rows = [r for r in records if r.get("decision") != "hold"]
    last_knee = {
        json.dumps(r.get("deployment"), sort_keys=True): id(r) for r in rows if r["kind"] == "knee"
    }
    rows = [r for r in rows if r["kind"] != "knee" or id(r) in last_knee.values()]
    rows.sort(key=lambda r: (str(r.get("deployment")), r.get("ts_ms", 0)))
    table = Table(title="tailguard · capacity decisions", expand=True)
    for col in ("event time", "deployment", "kind", "decision", "evidence"):
        table.add_column(col)
    colour = {"scale_up": "red", "open": "red", "scale_down": "green", "closed": "green"}
    for r in rows:
        when, where, what = _capacity_parts(r)
        c = colour.get(r.get("decision", ""), "yellow")
        table.add_row(when, where, r.get("kind", "?"), f"[{c}]{r.get('decision')}[/{c}]", what)
    _console().print(table)
    return rows


def _pct(x: Any) -> str:
    return f"{100 * x:.2f} %" if isinstance(x, int | float) else "–"


def release_lines(rec: dict[str, Any]) -> list[str]:
    """A ``tailguard.release.v1`` decision in a few readable lines.

    The first line says what was decided (and its reasons unless a breached
    guardrail below spells them out); per breached guardrail its arms, difference
    and limit — for the human-feedback guardrail also the permutation p-value, the
    look, the raters and the strata; then per arm the prompt groups and versions
    holding its bad requests, with exemplar trace ids.
    """
    ev = rec.get("evidence") or {}
    when = time.strftime("%H:%M:%S", time.gmtime(rec.get("ts_ms", 0) / 1000)) + "Z"
    weights = ", ".join(f"{a} {w:.0%}" for a, w in (rec.get("weights") or {}).items())
    about = ([f"arm {rec['arm']}"] if rec.get("arm") else []) + (
        [f"weights {weights}"] if weights else []
    )
    head = f"{rec.get('decision')} {rec.get('experiment')}" + (
        f" ({'; '.join(about)})" if about else ""
    )
    lines = [f"{when}  {head}"]
    breached = {k: m for k, m in (ev.get("metrics") or {}).items() if m.get("status") == "breached"}
    if not breached:
        lines += [f"  {r}" for r in rec.get("reasons") or []]
    for key, m in breached.items():
        arms = m.get("arms") or {}
        limit = ", ".join(f"{k} {v}" for k, v in (m.get("constraint") or {}).items())
        values = " vs ".join(
            f"{a} {_pct(x.get('value')) if m.get('effect') == 'diff' else x.get('value')} "
            f"(n {x.get('n', 0):,})"
            for a, x in arms.items()
        )
        diff = m.get("difference")
        lo, hi = (m.get("interval") or [None, None])[:2]
        span = f" [{100 * lo:+.2f}, {100 * hi:+.2f}]" if lo is not None and hi is not None else ""
        effect = f"difference {100 * diff:+.2f} points{span}" if diff is not None else ""
        lines.append(f"  {key}: {values}; {effect} (limit {limit})")
        t = m.get("test")
        if not t:
            continue
        per_arm = ", ".join(f"{a} {n}" for a, n in (t.get("raters_per_arm") or {}).items())
        lines.append(
            f"  human feedback: {t.get('test')} p = {t.get('p_value', 0):.2g} "
            f"< {t.get('alpha_per_look', 0):.2g} at look {t.get('look')} of {t.get('looks')} "
            f"({t.get('look_at_ratings')} ratings per arm); {t.get('raters')} raters ({per_arm})"
        )
        strata = [
            f"{name} ("
            + ", ".join(
                f"{a} {c['hallucination']}/{c['rated']:,}" for a, c in cells.items() if c["rated"]
            )
            + ")"
            for name, cells in (t.get("strata") or {}).items()
        ]
        pooled = "; single-arm strata pooled" if t.get("pooled_single_arm_strata") else ""
        lines.append(f"  strata (hallucinations/rated): {', '.join(strata)}{pooled}")
    served = {a: s.get("prompt_versions") or {} for a, s in (ev.get("arms") or {}).items()}
    groups = ev.get("prompt_groups") or {}
    for name in dict.fromkeys([*([rec["arm"]] if rec.get("arm") else []), *served, *groups]):
        versions = ", ".join(f"{v} {n:,}" for v, n in served.get(name, {}).items()) or "–"
        rows = [
            f"{g.get('prompt_group')} [{', '.join(g.get('versions') or [])}] "
            f"{g.get('bad', 0)} bad of {g.get('requests', 0):,}, traces "
            + (", ".join(g.get("exemplars") or []) or "–")
            for g in groups.get(name) or []
        ]
        lines.append(
            f"  {name}: prompts served {versions}"
            + (f"; bad requests from {'; '.join(rows)}" if rows else "")
        )
    return lines


def watch_release(
    broker: str, *, experiment: str, timeout_s: float, until: str = "rollback"
) -> dict[str, Any] | None:
    """Print every decision about ``experiment`` on ``tailguard.releases``, from the
    beginning, as it arrives — a line each, and ``until`` (default ``rollback``) in
    full (:func:`release_lines`); returns that decision, or None after ``timeout_s``."""
    out = _console()
    for _key, value, _headers in follow(
        broker, default_prefix() + RELEASES, from_beginning=True, timeout_s=timeout_s
    ):
        rec: dict[str, Any] = json.loads(value or b"{}")
        if rec.get("experiment") != experiment:
            continue
        lines = release_lines(rec)
        final = rec.get("decision") == until
        for line in lines if final else lines[:1]:
            out.print("  " + line, markup=False, highlight=False, soft_wrap=True)
        if final:
            return rec
    return None


@dataclass(frozen=True, slots=True)
class TopicRead:
    """The records of a topic from its start to the end offsets it had when reading began."""

    topic: str
    records: list[dict[str, Any]]
    #: Values that were not a JSON object: counted, not returned.
    undecodable: int
    #: False when reading gave up (``idle_s`` without progress) before the end offsets.
    complete: bool


def read_to_end(broker: str, topic: str, *, idle_s: float = 5.0) -> TopicRead:
    """Every JSON record of ``topic``, all partitions, up to its end offsets at the start.

    Unlike :func:`follow`, it stops as soon as each partition's position reaches
    the high watermark it had when reading began (control records of
    transactions included), so records written meanwhile are left for the next
    run. ``idle_s`` bounds the wait for a record that does not come.
    """
    admin = ensure_broker(broker)
    meta = admin.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None:
        msg = (
            f"topic {topic} does not exist on {broker}; run `tailguard topics create` and a "
            "worker first (or set TAILGUARD_TOPIC_PREFIX to the deployment's namespace)"
        )
        raise TopicMissing(msg)
    consumer = Consumer(
        {
            "bootstrap.servers": broker,
            "group.id": f"tailguard-report-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    records: list[dict[str, Any]] = []
    undecodable = 0
    try:
        ends: dict[int, int] = {}
        for p in meta.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        last = time.monotonic()
        while ends:
            msgs = consumer.consume(1000, timeout=0.5)
            for m in msgs:
                error = m.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    msg = f"could not read {topic}: {error}"
                    raise TailguardError(msg)
                partition, offset = m.partition(), m.offset()
                end = None if partition is None else ends.get(partition)
                if end is None or offset is None or offset >= end:
                    continue
                try:
                    value = json.loads(m.value() or b"null")
                except (ValueError, UnicodeDecodeError):
                    value = None
                if isinstance(value, dict):
                    records.append(value)
                else:
                    undecodable += 1
            if msgs:
                last = time.monotonic()
            positions = consumer.position([TopicPartition(topic, p) for p in ends])
            for tp in positions:
                if tp.offset >= 0 and tp.offset >= ends[tp.partition]:
                    del ends[tp.partition]
            if ends and time.monotonic() - last > idle_s:
                return TopicRead(topic, records, undecodable, complete=False)
    finally:
        consumer.close()
    return TopicRead(topic, records, undecodable, complete=True)


def heatmap_report(
    broker: str,
    *,
    out_dir: Path,
    idle_s: float = 5.0,
    window: str = "1m",
    series: Sequence[str] = (),
    top: int | None = 10,
    last: int | None = None,
) -> "ReportFiles":
    """``tailguard report``: the SLI and breach tables, then the time × stage P99 heatmaps.

    Reads ``tailguard.sli`` and ``tailguard.breaches`` once, up to their end
    offsets, prints the two tables as before and writes the heatmap files of
    :func:`tailguard.report.write_report` into ``out_dir``.
    """
    from tailguard.report import build_heatmaps, write_report

    out = _console()
    sli = read_to_end(broker, default_prefix() + SLI, idle_s=idle_s)
    breaches = read_to_end(broker, default_prefix() + BREACHES, idle_s=idle_s)
    for read in (sli, breaches):
        if not read.complete:
            out.print(
                f"[yellow]warning: stopped reading {read.topic} after {idle_s:g} s without a "
                "record before its end offsets; the report may miss records[/yellow]"
            )
        if read.undecodable:
            out.print(f"[yellow]warning: {read.undecodable} non-JSON record(s) on {read.topic}[/]")
    report(broker, idle_s=idle_s, window=window, records=sli.records)
    breach_report(broker, idle_s=idle_s, records=breaches.records)
    try:
        capacity = read_to_end(broker, default_prefix() + CAPACITY, idle_s=idle_s)
    except TopicMissing:
        capacity = None
    if capacity is not None and capacity.records:
        capacity_report(broker, records=capacity.records)
    heatmaps = build_heatmaps(sli.records, breaches.records, window=window, last=last)
    try:
        files = write_report(
            out_dir, heatmaps, breaches.records, window=window, patterns=series, top=top
        )
    except OSError as exc:
        msg = f"cannot write the report into {out_dir}: {exc.strerror or exc}; choose --out"
        raise TailguardError(msg) from None
    shown = {hm.key: hm for hm in heatmaps}
    drawn, total = len(files.pngs), len(files.candidates)
    scope = "" if drawn == total else f" (the top {drawn} of {total} by worst stage P99 growth)"
    out.print(
        f"time × stage P99 heatmaps of {drawn} series{scope} → {files.index} · {files.data.name}"
    )
    for key, png in files.pngs.items():
        growth, stage = shown[key].growth()
        n = len(shown[key].breaches)
        out.print(
            f"  ×{growth:5.1f} {stage:<10} {key}  {png.name}"
            + (f"  ({n} breach{'es' if n != 1 else ''})" if n else ""),
            highlight=False,
        )
    if drawn < total:
        out.print("  choose others with --series PATTERN or --top N", highlight=False)
    return files
