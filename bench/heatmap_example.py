"""The article's silent collapse as a stage heatmap, without a broker.

``python -m bench.heatmap_example`` runs 50 minutes of simulated traffic of one
series (a 10-minute ``silent_collapse`` from minute 25) through the real fold,
final 1-minute snapshots, silent-collapse detector and heatmap renderer, and
writes ``bench/results/heatmap-silent-collapse.png``.
"""

from pathlib import Path
from typing import Any

import msgspec
from tailguard.agents.breaches import window_stats
from tailguard.agents.sli import snapshot_payload
from tailguard.schemas import InferenceEvent
from tailguard.streams import RingConfig, SeriesWindows, Thresholds
from tailguard.streams.silent import SilentPolicy, SilentState, advance_silent

from tailguard.report import build_heatmaps, render_png
from tailguard.simulator.config import Incident, ModelSpec, ServiceSpec, SimConfig, Target
from tailguard.simulator.model import generate

MIN = 60_000
OUT = Path("bench/results/heatmap-silent-collapse.png")
SERIES = ("chat", "llama-70b", "control", "acme")


def main() -> None:
    start = 1_764_400_000_000 - 1_764_400_000_000 % MIN
    cfg = SimConfig(
        rate=6.0,
        duration_s=50 * 60.0,
        seed=11,
        services=(ServiceSpec(name="chat", models=(ModelSpec(name="llama-70b"),)),),
        tenants=("acme",),
        variants=("control",),
        experiment=None,
        start_ms=start,
        incidents=(Incident("silent_collapse", 25 * 60.0, 35 * 60.0, Target(service="chat")),),
    )
    events = [msgspec.convert(e, InferenceEvent) for e in generate(cfg)]
    windows = SeriesWindows(RingConfig(), Thresholds())
    policy = SilentPolicy()
    snapshots: list[dict[str, Any]] = []
    breaches: list[dict[str, Any]] = []
    state = [SilentState(series_key="|".join(SERIES))]

    def on_close(end: int) -> None:
        snapshots.append(snapshot_payload(SERIES, windows, "1m", end, final=True, now_ms=end))
        minute = window_stats(windows.window(MIN, end), MIN)
        short = window_stats(windows.window(5 * MIN, end), 5 * MIN)
        state[0], out = advance_silent(state[0], end, minute, short, policy)
        for t in out:
            breaches.append(
                {
                    "breach_id": t.breach_id,
                    "seq": t.seq,
                    "state": t.state,
                    "kind": "silent_degradation",
                    "severity": t.severity,
                    "slo": "latency_attainment",
                    "series": dict(
                        zip(("service", "model", "variant", "tenant"), SERIES, strict=True)
                    ),
                    "at_ms": t.at_ms,
                    "opened_ms": t.opened_ms,
                    "resolved_ms": t.resolved_ms,
                }
            )

    for i in range(0, len(events), 200):
        windows.add(events[i : i + 200], on_close=on_close)
    print(
        f"{len(snapshots)} final 1m snapshots; silent breach:",
        [(b["state"], f"minute {(b['at_ms'] - start) // MIN}") for b in breaches],
    )
    for heatmap in build_heatmaps(snapshots, breaches, window="1m"):
        print(render_png(heatmap, OUT))


if __name__ == "__main__":
    main()
