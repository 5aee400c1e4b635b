"""``tailguard report`` on the real broker: SLI snapshots and a breach in, heatmap files out."""

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from tailguard.schemas import PercentileSummary, Series, SliSnapshot

from .conftest import Namespace

pytestmark = pytest.mark.integration

T0 = 1_717_243_200_000  # 2024-06-01 12:00 UTC
MIN = 60_000
SERIES = Series(service="chat", model="llama-3.1-8b", variant="default", tenant="default")
SLUG = "chat-llama-3.1-8b-default-default"
Produce = Callable[[str, str, list[tuple[bytes | None, bytes]]], list[tuple[int, int]]]


def summary(p99: float) -> PercentileSummary:
    return PercentileSummary(p50=p99 / 3, p90=p99 / 2, p95=p99 / 1.5, p99=p99, p999=p99, count=60)


def snap(minute: int, prefill: float, *, final: bool = True, window: str = "1m") -> bytes:
    end = T0 + minute * MIN
    stages = {"tokenize": summary(3.0), "prefill": summary(prefill), "decode": summary(650.0)}
    if minute == 2:
        del stages["tokenize"]  # no request reported it: a blank cell
    return msgspec.json.encode(
        SliSnapshot(
            event_id=f"s-{minute}-{final}-{window}",
            ts_ms=end + 2_000,
            series=SERIES,
            window=window,
            window_s={"1m": 60, "5m": 300}[window],
            window_end_ms=end,
            final=final,
            count=60,
            errors=0,
            ttft_ms=summary(prefill + 10),
            tpot_ms=summary(30.0),
            itl_ms=summary(30.0),
            e2e_ms=summary(prefill + 700),
            goodput_rps=1.0,
            slo_compliance=1.0 if prefill < 800 else 0.2,
            stages_ms=stages,
        )
    )


def test_report_writes_the_heatmap_png_html_and_json(
    namespace: Namespace, produce: Produce, tmp_path: Path
) -> None:
    prefill = {1: 200.0, 2: 205.0, 3: 1_500.0, 4: 1_480.0, 5: 210.0}
    key: bytes | None = b"chat|llama-3.1-8b|default|default"
    sli = [(key, snap(m, p)) for m, p in prefill.items()]
    sli += [(key, snap(4, 99_999.0, final=False)), (key, snap(4, 77_777.0, window="5m"))]
    sli.append((key, b"not json"))
    produce(namespace.broker, namespace.topic("tailguard.sli"), sli)
    breach = {
        "schema": "tailguard.breach.v1",
        "event_id": "b-1:0",
        "ts_ms": T0 + 3 * MIN + 1_000,
        "breach_id": "b-1",
        "state": "opened",
        "seq": 0,
        "kind": "burn_rate",
        "severity": "page",
        "slo": "ttft-p99",
        "series": msgspec.to_builtins(SERIES),
        "at_ms": T0 + 3 * MIN,
        "burn_rates": {"1h": 20.0, "5m": 40.0},
        "sli": {},
        "budget_remaining": 0.5,
        "exemplars": [],
        "attribution": [],
        "gpu": [],
        "gpu_note": None,
        "opened_ms": T0 + 3 * MIN,
        "resolved_ms": None,
    }
    breaches = [(key, json.dumps(breach).encode())]
    produce(namespace.broker, namespace.topic("tailguard.breaches"), breaches)

    out = tmp_path / "report"
    env = {
        **os.environ,
        "TAILGUARD_BROKER": namespace.broker,
        "TAILGUARD_TOPIC_PREFIX": namespace.prefix,
    }
    done = subprocess.run(
        [sys.executable, "-m", "tailguard.cli", "report", "--out", str(out), "--idle", "20"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "tailguard · report · final 1m windows" in done.stdout
    assert "ttft-p99" in done.stdout  # the breach table
    assert "1 non-JSON record(s)" in done.stdout
    assert f"heatmap-{SLUG}.png" in done.stdout
    png = (out / f"heatmap-{SLUG}.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width > 500 and height > 300
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "data:image/png;base64," in page
    assert ">1,500</td>" in page and ">1,480</td>" in page and ">205</td>" in page
    assert '<td class="blank"></td>' in page and "<td>b-1</td>" in page
    doc = json.loads((out / "heatmap.json").read_text())
    (series,) = doc["series"]
    assert series["stages"] == ["tokenize", "prefill", "decode"]
    assert series["minutes"] == [T0 + m * MIN for m in prefill]
    assert series["p99_ms"] == [
        [3.0, None, 3.0, 3.0, 3.0],
        [200.0, 205.0, 1_500.0, 1_480.0, 210.0],
        [650.0] * 5,
    ]
    (b,) = series["breaches"]
    assert (b["breach_id"], b["state"], b["opened_ms"], b["resolved_ms"]) == (
        "b-1",
        "opened",
        T0 + 3 * MIN,
        None,
    )
    assert b["top_stages"][0]["stage"] == "prefill"
