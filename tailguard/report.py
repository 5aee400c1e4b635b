"""Time × stage P99 heatmaps per series: the report part of latency attribution.

Source: the final ``tailguard.sli.v1`` snapshots of one window (``1m`` by
default), whose ``stages_ms`` holds a percentile summary per pipeline stage,
and the ``tailguard.breach.v1`` lifecycle records of the same series. For every
series this module builds one matrix, rows = stages, columns = window ends::

    window end (UTC) →   12:01  12:02  12:03  12:04  12:05  12:06
                                       ┌── breach ttft-p99 ──┐
    tokenize               3.1    3.0  │  3.2    3.1    3.0  │  3.1
    queue                   12     11  │   14     13     12  │   12
    prefill                210    205  │ 1480   1510   1495  │  220   ← the stage that blew up
    decode                 640    650  │  655    648    652  │  645
    detokenize             1.2    1.1  │  1.2    1.2    1.1  │  1.2
                                       └─────────────────────┘
    cell = P99 in ms of the window ending there; blank = no request reported the stage

Rows follow the pipeline (tokenize, queue, prefill, decode, detokenize), then
any other stage alphabetically. Columns form a regular grid from the series'
first to its last window end (a minute without a final snapshot is a blank
column, not a missing one), so gaps in traffic stay visible. A breach covers
the columns whose window ends in ``[opened_ms, resolved_ms)`` (to the last
column while it is still open): it opens at the evaluation of the window that
broke it and resolves at the first evaluation that no longer does.

Building (:func:`build_heatmaps`) is pure and works on the decoded JSON dicts
exactly as they are on the topic; rendering writes ``heatmap-<slug>.png``
(matplotlib, Agg, log colour scale), ``index.html`` (self-contained: PNGs
embedded, the numbers as tables, the breach list) and ``heatmap.json`` (the
matrices as data) into one folder (:func:`write_report`). Reading the topics
is :mod:`tailguard.console`'s job.

Series are ranked for rendering by P99 growth: for each stage, its worst P99
over the median P99 of its row; a series scores its worst stage. A flat series
scores about 1, a series whose prefill went from 200 to 1,500 ms about 7.5.
"""

import base64
import fnmatch
import hashlib
import html
import itertools
import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from tailguard.errors import TailguardError
from tailguard.streams import WINDOWS

__all__ = [
    "STAGE_ORDER",
    "Breach",
    "NoStageData",
    "ReportFiles",
    "StageHeatmap",
    "StageRise",
    "build_heatmaps",
    "collect_breaches",
    "final_cadence_ms",
    "render_html",
    "render_png",
    "select",
    "series_key",
    "slugs",
    "to_json",
    "write_report",
]

#: Pipeline order of the stages the contract names (the keys of ``stages_ms``).
STAGE_ORDER: Final = ("tokenize", "queue", "prefill", "decode", "detokenize")

_MINUTE_MS: Final = 60_000
#: Colour map of the PNG and of the HTML tables; missing cells are grey.
_CMAP: Final = "viridis"
_MISSING: Final = "#d9d9d9"
_BREACH: Final = "#e3000f"
_STATE_RANK: Final = {"opened": 0, "updated": 1, "resolved": 2}


class NoStageData(TailguardError, LookupError):
    """No series has per-stage latency to draw (or none matches the filter)."""


def series_key(series: Mapping[str, Any]) -> str:
    """``service/model/variant/tenant``, as the console tables name a series."""
    return "/".join(
        str(series.get(part) or default)
        for part, default in (
            ("service", "?"),
            ("model", "?"),
            ("variant", "default"),
            ("tenant", "default"),
        )
    )


@dataclass(frozen=True, slots=True)
class Breach:
    """One breach of one series, folded from its lifecycle records."""

    breach_id: str
    series_key: str
    series: dict[str, Any]
    kind: str
    slo: str
    severity: str
    #: Last state seen: ``opened``, ``updated`` or ``resolved``.
    state: str
    opened_ms: int
    resolved_ms: int | None

    def covers(self, end_ms: int) -> bool:
        """Whether the window ending at ``end_ms`` lies inside the breach."""
        return self.opened_ms <= end_ms and (self.resolved_ms is None or end_ms < self.resolved_ms)

    def to_dict(self) -> dict[str, Any]:
        return {
            "breach_id": self.breach_id,
            "series": self.series,
            "kind": self.kind,
            "slo": self.slo,
            "severity": self.severity,
            "state": self.state,
            "opened_ms": self.opened_ms,
            "resolved_ms": self.resolved_ms,
        }


def collect_breaches(records: Iterable[Mapping[str, Any]]) -> list[Breach]:
    """Fold ``tailguard.breach.v1`` records into one :class:`Breach` per ``breach_id``.

    Records without ``breach_id``, ``series`` or an opening time are skipped.
    The opening time is ``opened_ms`` (any state carries it), else the
    ``at_ms`` of the ``opened`` record; ``resolved_ms`` comes from the
    ``resolved`` record; the state is that of the highest ``seq`` (else the
    furthest in the lifecycle), whatever order the records come in. Ordered by
    opening time, then id.
    """
    folded: dict[str, dict[str, Any]] = {}
    for rec in records:
        bid = rec.get("breach_id")
        series = rec.get("series")
        if not isinstance(bid, str) or not isinstance(series, Mapping):
            continue
        b = folded.setdefault(
            bid,
            {
                "series": dict(series),
                "opened_ms": None,
                "resolved_ms": None,
                "state": None,
                "rank": (-2, -2),
            },
        )
        for name in ("kind", "slo", "severity"):
            if rec.get(name) is not None:
                b[name] = str(rec[name])
        state = rec.get("state")
        seq = rec.get("seq")
        # The newest transition names the state. Records of one breach share a key and so
        # a partition, but a reader must not depend on the order it merges partitions in.
        rank = (seq if isinstance(seq, int) else -1, _STATE_RANK.get(str(state), -1))
        if state is not None and rank >= b["rank"]:
            b["state"], b["rank"] = str(state), rank
        opened = rec.get("opened_ms")
        if opened is None and state == "opened":
            opened = rec.get("at_ms")
        if isinstance(opened, int | float):
            b["opened_ms"] = int(opened) if b["opened_ms"] is None else min(b["opened_ms"], opened)
        resolved = rec.get("resolved_ms")
        if resolved is None and state == "resolved":
            resolved = rec.get("at_ms")
        if isinstance(resolved, int | float):
            b["resolved_ms"] = int(resolved)
    out = [
        Breach(
            breach_id=bid,
            series_key=series_key(b["series"]),
            series=b["series"],
            kind=b.get("kind", "burn_rate"),
            slo=b.get("slo", "?"),
            severity=b.get("severity", "?"),
            state=b["state"] or "?",
            opened_ms=int(b["opened_ms"]),
            resolved_ms=b["resolved_ms"],
        )
        for bid, b in folded.items()
        if b["opened_ms"] is not None
    ]
    out.sort(key=lambda b: (b.opened_ms, b.breach_id))
    return out


@dataclass(frozen=True, slots=True)
class StageRise:
    """How far one stage's P99 rose during a breach over its baseline."""

    stage: str
    baseline_ms: float
    peak_ms: float

    @property
    def rise_ms(self) -> float:
        return self.peak_ms - self.baseline_ms

    @property
    def ratio(self) -> float:
        return self.peak_ms / self.baseline_ms if self.baseline_ms > 0 else math.inf


@dataclass(slots=True)
class StageHeatmap:
    """The time × stage P99 matrix of one series: ``p99[row][col]`` in ms, ``None`` = blank."""

    key: str
    series: dict[str, Any]
    window: str
    step_ms: int
    #: Window end of each column, epoch ms, ascending.
    minutes: list[int]
    #: Stage of each row, pipeline order first.
    stages: list[str]
    p99: list[list[float | None]]
    breaches: list[Breach] = field(default_factory=list)

    def values(self) -> list[float]:
        return [v for row in self.p99 for v in row if v is not None]

    def columns_of(self, breach: Breach) -> list[int]:
        """Indices of the columns inside ``breach``."""
        return [c for c, end in enumerate(self.minutes) if breach.covers(end)]

    def growth(self) -> tuple[float, str]:
        """Worst P99 growth and its stage: max over stages of worst P99 / median P99 of the row."""
        best = (1.0, self.stages[0] if self.stages else "")
        for stage, row in zip(self.stages, self.p99, strict=True):
            vals = [v for v in row if v is not None]
            if not vals:
                continue
            ratio = max(vals) / max(statistics.median(vals), 1e-3)
            if ratio > best[0]:
                best = (ratio, stage)
        return best

    def rises(self, breach: Breach, top: int = 3) -> list[StageRise]:
        """The ``top`` stages whose P99 rose most during ``breach`` over their baseline.

        Baseline = median P99 of the stage over the columns before the breach
        opened (over all columns outside it when none precede it); peak = the
        worst P99 inside it. Only stages that rose are listed.
        """
        inside = set(self.columns_of(breach))
        if not inside:
            return []
        before = [c for c, end in enumerate(self.minutes) if end < breach.opened_ms]
        base_cols = before or [c for c in range(len(self.minutes)) if c not in inside]
        out: list[StageRise] = []
        for stage, row in zip(self.stages, self.p99, strict=True):
            peak = [row[c] for c in inside if row[c] is not None]
            base = [row[c] for c in base_cols if row[c] is not None]
            if not peak or not base:
                continue
            rise = StageRise(
                stage,
                baseline_ms=statistics.median(v for v in base if v is not None),
                peak_ms=max(v for v in peak if v is not None),
            )
            if rise.rise_ms > 0:
                out.append(rise)
        out.sort(key=lambda r: (-r.rise_ms, r.stage))
        return out[:top]

    def to_dict(self) -> dict[str, Any]:
        growth, stage = self.growth()
        return {
            "key": self.key,
            "series": self.series,
            "window": self.window,
            "step_ms": self.step_ms,
            "minutes": self.minutes,
            "stages": self.stages,
            "p99_ms": self.p99,
            "growth": round(growth, 3),
            "growth_stage": stage,
            "breaches": [
                {
                    **b.to_dict(),
                    "top_stages": [
                        {
                            "stage": r.stage,
                            "baseline_ms": r.baseline_ms,
                            "peak_ms": r.peak_ms,
                        }
                        for r in self.rises(b)
                    ],
                }
                for b in self.breaches
            ],
        }


def _stage_sort_key(stage: str) -> tuple[int, str]:
    return (STAGE_ORDER.index(stage), "") if stage in STAGE_ORDER else (len(STAGE_ORDER), stage)


def _matches_window(snap: Mapping[str, Any], window: str) -> bool:
    name = snap.get("window")
    if name is not None:
        return bool(name == window)
    window_ms = WINDOWS.get(window)
    return window_ms is not None and snap.get("window_s") == window_ms // 1000


def final_cadence_ms(window: str) -> int:
    """How often (event time) the worker publishes a final snapshot of ``window``.

    Mirrors ``tailguard.agents.sli.final_cadence_ms`` (every minute up to 5 m,
    every 5 minutes up to 1 h, hourly beyond) without importing faust.
    """
    ms = WINDOWS.get(window, _MINUTE_MS)
    if ms <= 300_000:
        return _MINUTE_MS
    if ms <= 3_600_000:
        return 300_000
    return 3_600_000


def _grid(ends: list[int], cadence_ms: int) -> tuple[int, list[int]]:
    """The step and the regular grid of window ends from the first to the last.

    step = gcd(cadence, every gap between window ends): the publishing cadence
    unless the ends are not aligned to it.
    """
    step = cadence_ms
    for a, b in itertools.pairwise(ends):
        step = math.gcd(step, b - a)
    if len(ends) < 2:
        return step, list(ends)
    columns = (ends[-1] - ends[0]) // step + 1
    if columns > max(10_000, 4 * len(ends)):  # unaligned ends: keep them as they are
        return cadence_ms, list(ends)
    return step, list(range(ends[0], ends[-1] + step, step))


def build_heatmaps(
    snapshots: Iterable[Mapping[str, Any]],
    breaches: Iterable[Mapping[str, Any]] = (),
    *,
    window: str = "1m",
    last: int | None = None,
) -> list[StageHeatmap]:
    """One heatmap per series that reported any stage, ordered by series key.

    ``snapshots``: decoded ``tailguard.sli.v1`` records. Only final snapshots
    of ``window`` count (provisional ones include the open minute and change);
    a window end seen twice (a replay) keeps the last record. ``breaches``:
    decoded ``tailguard.breach.v1`` records. ``last``: keep only each series'
    last ``last`` columns.
    """
    cells: dict[str, dict[int, dict[str, float | None]]] = {}
    series_of: dict[str, dict[str, Any]] = {}
    for snap in snapshots:
        if not snap.get("final") or not _matches_window(snap, window):
            continue
        series = snap.get("series")
        end = snap.get("window_end_ms")
        stages = snap.get("stages_ms") or {}
        if not isinstance(series, Mapping) or not isinstance(end, int):
            continue
        key = series_key(series)
        series_of[key] = dict(series)
        row: dict[str, float | None] = {}
        for stage, summary in stages.items():
            p99 = summary.get("p99") if isinstance(summary, Mapping) else None
            row[str(stage)] = float(p99) if isinstance(p99, int | float) else None
        cells.setdefault(key, {})[end] = row
    by_series: dict[str, list[Breach]] = {}
    for b in collect_breaches(breaches):
        by_series.setdefault(b.series_key, []).append(b)
    out: list[StageHeatmap] = []
    for key in sorted(cells):
        per_end = cells[key]
        stages = sorted({s for row in per_end.values() for s in row}, key=_stage_sort_key)
        if not any(v is not None for row in per_end.values() for v in row.values()):
            continue
        step, minutes = _grid(sorted(per_end), final_cadence_ms(window))
        if last is not None and last > 0:
            minutes = minutes[-last:]
        matrix = [[per_end.get(end, {}).get(stage) for end in minutes] for stage in stages]
        out.append(
            StageHeatmap(
                key=key,
                series=series_of[key],
                window=window,
                step_ms=step,
                minutes=minutes,
                stages=stages,
                p99=matrix,
                breaches=by_series.get(key, []),
            )
        )
    return out


def select(
    heatmaps: Sequence[StageHeatmap], patterns: Sequence[str] = (), top: int | None = 10
) -> list[StageHeatmap]:
    """The heatmaps to render: those matching any glob of ``patterns`` (all when
    none), the ``top`` by P99 growth (ties: worst P99, then key); in that rank order.

    A pattern without ``*``, ``?`` or ``[`` matches as a substring of the key.
    """

    def wanted(key: str) -> bool:
        if not patterns:
            return True
        return any(
            fnmatch.fnmatchcase(key, p) if any(ch in p for ch in "*?[") else p in key
            for p in patterns
        )

    picked = [h for h in heatmaps if wanted(h.key)]
    picked.sort(key=lambda h: (-h.growth()[0], -max(h.values(), default=0.0), h.key))
    return picked if top is None else picked[:top]


def slugs(keys: Iterable[str]) -> dict[str, str]:
    """A file-name-safe slug per series key, unique (a short hash settles collisions)."""
    out: dict[str, str] = {}
    taken: dict[str, int] = {}
    keys = list(keys)
    for key in keys:
        slug = re.sub(r"[^a-z0-9._]+", "-", key.lower()).strip("-.") or "series"
        taken[slug] = taken.get(slug, 0) + 1
        out[key] = slug
    for key in keys:
        if taken[out[key]] > 1:
            out[key] += "-" + hashlib.blake2b(key.encode(), digest_size=3).hexdigest()
    return out


# --- rendering -------------------------------------------------------------------


def _utc(ms: int, fmt: str = "%H:%M") -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime(fmt)


def _fmt_ms(v: float | None) -> str:
    if v is None:
        return ""
    if v >= 10_000:
        return f"{v / 1000:.0f}k"
    if v >= 10:
        return f"{v:,.0f}"
    return f"{v:.1f}"


def _norm_range(values: Sequence[float]) -> tuple[float, float]:
    """Log colour scale limits: positive, and apart even for a single value."""
    positive = [v for v in values if v > 0]
    lo = min(positive, default=0.1)
    hi = max(positive, default=1.0)
    if hi <= lo * 1.01:
        lo, hi = lo / 2, hi * 2
    return lo, hi


def _ticks(minutes: Sequence[int], step_ms: int, most: int = 14) -> list[int]:
    """Column indices to label: on round times, at most about ``most`` of them."""
    if not minutes:
        return []
    span = minutes[-1] - minutes[0] + step_ms
    for every_min in (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880, 10080):
        every = every_min * _MINUTE_MS
        if every >= step_ms and span / every <= most:
            picked = [c for c, end in enumerate(minutes) if end % every == 0]
            if picked:
                return picked
    k = max(1, math.ceil(len(minutes) / most))
    return list(range(0, len(minutes), k))


def render_png(heatmap: StageHeatmap, path: Path, *, dpi: int = 110) -> Path:
    """Draw the heatmap of one series to ``path`` (PNG) and return it.

    Uses a bare :class:`matplotlib.figure.Figure` (Agg canvas, no pyplot state),
    so it is safe without a display and in threads.
    """
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import FuncFormatter, LogLocator
    from matplotlib.transforms import blended_transform_factory

    nrows, ncols = len(heatmap.stages), len(heatmap.minutes)
    data = np.ma.masked_invalid(
        np.array([[np.nan if v is None else v for v in row] for row in heatmap.p99], dtype=float)
    )
    lo, hi = _norm_range(heatmap.values())
    norm = LogNorm(vmin=lo, vmax=hi, clip=True)
    cmap = colormaps[_CMAP].with_extremes(bad=_MISSING)

    width = min(22.0, max(9.0, 3.2 + 0.34 * ncols))
    height = max(3.6, 2.2 + 0.48 * nrows)
    fig = Figure(figsize=(width, height), layout="constrained")
    ax = fig.add_subplot()
    # a P99 of 0 ms is a value, not a blank: lift it to the scale's floor
    data = np.ma.masked_invalid(np.maximum(data.filled(np.nan), lo))
    image = ax.imshow(
        data,
        aspect="auto",
        interpolation="nearest",
        cmap=cmap,
        norm=norm,
    )
    ax.set_yticks(range(nrows), heatmap.stages)
    ticks = _ticks(heatmap.minutes, heatmap.step_ms)
    day_of_first = _utc(heatmap.minutes[0], "%Y-%m-%d") if heatmap.minutes else ""
    labels = []
    prev_day = day_of_first
    for c in ticks:
        day = _utc(heatmap.minutes[c], "%Y-%m-%d")
        labels.append(
            _utc(heatmap.minutes[c]) if day == prev_day else _utc(heatmap.minutes[c], "%m-%d %H:%M")
        )
        prev_day = day
    ax.set_xticks(
        ticks,
        labels,
        rotation=45 if len(ticks) > 8 else 0,
        ha="right" if len(ticks) > 8 else "center",
    )
    ax.set_xlabel(f"window end, UTC ({day_of_first})")
    ax.tick_params(axis="both", labelsize=9)
    # thin white lines between cells (as two line collections: minor ticks per cell are slow)
    ax.hlines(np.arange(0.5, nrows - 1), -0.5, ncols - 0.5, colors="white", linewidth=1.0)
    if ncols <= 120:
        ax.vlines(np.arange(0.5, ncols - 1), -0.5, nrows - 0.5, colors="white", linewidth=0.6)

    if ncols <= 40:
        rgba = cmap(norm(data.filled(lo)))
        for r in range(nrows):
            for c in range(ncols):
                v = heatmap.p99[r][c]
                if v is None:
                    continue
                red, green, blue = rgba[r, c, :3]
                light = 0.299 * red + 0.587 * green + 0.114 * blue > 0.55
                ax.text(
                    c,
                    r,
                    _fmt_ms(v),
                    ha="center",
                    va="center",
                    fontsize=7.5,
                    color="black" if light else "white",
                )

    band = blended_transform_factory(ax.transData, ax.transAxes)
    drawn = 0
    for b in heatmap.breaches:
        cols = heatmap.columns_of(b)
        if not cols:
            continue
        drawn += 1
        c0, c1 = cols[0], cols[-1]
        ax.add_patch(
            Rectangle(
                (c0 - 0.5, -0.5),
                c1 - c0 + 1,
                nrows,
                fill=False,
                edgecolor=_BREACH,
                linewidth=2.2,
                linestyle=(0, (4, 2)),
            )
        )
        ax.add_patch(
            Rectangle(
                (c0 - 0.5, 1.01),
                c1 - c0 + 1,
                0.05,
                transform=band,
                clip_on=False,
                facecolor=_BREACH,
                edgecolor="none",
            )
        )
        until = "open" if b.resolved_ms is None else _utc(b.resolved_ms)
        rises = heatmap.rises(b, top=1)
        worst = f" · {rises[0].stage} ×{rises[0].ratio:.1f}" if rises else ""
        ax.text(
            c0 - 0.5,
            1.08,
            f"breach {b.slo} ({b.severity}) {_utc(b.opened_ms)}→{until}{worst}",
            transform=band,
            fontsize=8.5,
            color=_BREACH,
            ha="left",
            va="bottom",
            clip_on=False,
            fontweight="bold",
        )

    cbar = fig.colorbar(image, ax=ax, pad=0.01, fraction=0.04, aspect=12)
    cbar.set_label("P99 (ms, log scale)", fontsize=9)
    cbar.ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    cbar.ax.yaxis.set_major_formatter(
        FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    )
    cbar.ax.yaxis.set_minor_formatter(FuncFormatter(lambda _v, _pos: ""))
    cbar.ax.tick_params(labelsize=8)

    span = ""
    if heatmap.minutes:
        first, final = heatmap.minutes[0], heatmap.minutes[-1]
        span = f"{_utc(first, '%Y-%m-%d %H:%M')} – {_utc(final, '%H:%M')} UTC"
    ax.set_title(
        f"P99 per stage · {heatmap.key} · final {heatmap.window} windows\n"
        f"{span} · {ncols} window{'s' if ncols != 1 else ''} · "
        "grey = no request reported the stage",
        fontsize=10.5,
        pad=34 if drawn else 8,
        loc="left",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, facecolor="white")
    return path


def _cell_colours(heatmap: StageHeatmap) -> list[list[tuple[str, str] | None]]:
    """(background, text) colour of every cell, as in the PNG; ``None`` for blanks."""
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm, to_hex

    lo, hi = _norm_range(heatmap.values())
    norm = LogNorm(vmin=lo, vmax=hi, clip=True)
    cmap = colormaps[_CMAP]
    out: list[list[tuple[str, str] | None]] = []
    for row in heatmap.p99:
        line: list[tuple[str, str] | None] = []
        for v in row:
            if v is None:
                line.append(None)
                continue
            red, green, blue, _alpha = cmap(float(norm(max(v, lo))))
            light = 0.299 * red + 0.587 * green + 0.114 * blue > 0.55
            line.append((to_hex((red, green, blue)), "#000" if light else "#fff"))
        out.append(line)
    return out


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em;border-top:1px solid #ccc;padding-top:1em}
table{border-collapse:collapse;font-size:12px;margin:.5em 0}
th,td{border:1px solid #e0e0e0;padding:2px 5px;text-align:right;white-space:nowrap}
th{background:#f5f5f5;font-weight:600}
td.stage,th.stage{text-align:left;position:sticky;left:0;background:#f5f5f5}
th.breach{background:#e3000f;color:#fff}
td.blank{background:#d9d9d9}
.scroll{overflow-x:auto;max-width:100%}
img{max-width:100%;height:auto;border:1px solid #eee}
.note{color:#666;font-size:.9em}
table.list td{text-align:left}
"""


def _breach_rows(breaches: Sequence[Breach], heatmap_of: Mapping[str, StageHeatmap]) -> str:
    rows = []
    for b in breaches:
        hm = heatmap_of.get(b.series_key)
        rises = hm.rises(b) if hm is not None else []
        top = ", ".join(
            f"{r.stage} {_fmt_ms(r.baseline_ms)}→{_fmt_ms(r.peak_ms)} ms" for r in rises
        )
        resolved = "still open" if b.resolved_ms is None else _utc(b.resolved_ms, "%Y-%m-%d %H:%M")
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{html.escape(str(x))}</td>"
                for x in (
                    b.series_key,
                    b.slo,
                    b.kind,
                    b.severity,
                    b.state,
                    _utc(b.opened_ms, "%Y-%m-%d %H:%M"),
                    resolved,
                    top or "–",
                    b.breach_id,
                )
            )
            + "</tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "series",
            "SLO",
            "kind",
            "severity",
            "last state",
            "opened (UTC)",
            "resolved (UTC)",
            "stages that rose most (P99 baseline→peak)",
            "breach id",
        )
    )
    return f'<table class="list"><tr>{head}</tr>{"".join(rows)}</table>'


def _matrix_table(heatmap: StageHeatmap) -> str:
    in_breach = [any(b.covers(end) for b in heatmap.breaches) for end in heatmap.minutes]
    head = ['<th class="stage">stage \\ window end (UTC)</th>']
    for end, hot in zip(heatmap.minutes, in_breach, strict=True):
        title = html.escape(_utc(end, "%Y-%m-%d %H:%M UTC") + (" · in breach" if hot else ""))
        cls = ' class="breach"' if hot else ""
        head.append(f'<th{cls} title="{title}">{_utc(end)}</th>')
    body = []
    colours = _cell_colours(heatmap)
    for stage, row, tints in zip(heatmap.stages, heatmap.p99, colours, strict=True):
        cells = [f'<td class="stage">{html.escape(stage)}</td>']
        for v, tint in zip(row, tints, strict=True):
            if v is None or tint is None:
                cells.append('<td class="blank"></td>')
            else:
                bg, fg = tint
                cells.append(f'<td style="background:{bg};color:{fg}">{_fmt_ms(v)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        '<div class="scroll"><table><tr>'
        + "".join(head)
        + "</tr>"
        + "".join(body)
        + "</table></div>"
    )


def render_html(
    rendered: Sequence[tuple[StageHeatmap, Path]],
    breaches: Sequence[Breach],
    *,
    window: str,
    generated_ms: int,
    note: str = "",
    embed: bool = True,
) -> str:
    """The self-contained report page: per series its PNG (embedded as base64
    when ``embed``, else linked by file name), the P99 matrix as a table and
    its breaches; then every breach of every series."""
    heatmap_of = {hm.key: hm for hm, _png in rendered}
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<title>tailguard · P99 per stage</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>tailguard · time × stage P99 heatmaps</h1>",
        f'<p class="note">final {html.escape(window)} windows of <code>tailguard.sli</code> '
        f"(<code>stages_ms</code>), breaches from <code>tailguard.breaches</code>; generated "
        f"{_utc(generated_ms, '%Y-%m-%d %H:%M:%S')} UTC. Cells: P99 in ms of the window ending "
        "at that minute; grey = no request reported the stage; red columns = inside a breach.</p>",
    ]
    if note:
        parts.append(f'<p class="note">{html.escape(note)}</p>')
    parts.append("<ul>")
    for hm, png in rendered:
        growth, stage = hm.growth()
        parts.append(
            f'<li><a href="#{html.escape(png.stem)}">{html.escape(hm.key)}</a> — worst growth '
            f"×{growth:.1f} ({html.escape(stage)}), {len(hm.breaches)} breach(es)</li>"
        )
    parts.append("</ul>")
    for hm, png in rendered:
        if embed:
            data = base64.b64encode(png.read_bytes()).decode("ascii")
            src = f"data:image/png;base64,{data}"
        else:
            src = html.escape(png.name)
        parts.append(f'<h2 id="{html.escape(png.stem)}">{html.escape(hm.key)}</h2>')
        parts.append(
            f'<p><a href="{html.escape(png.name)}"><img src="{src}" '
            f'alt="P99 per stage heatmap of {html.escape(hm.key)}"></a></p>'
        )
        parts.append(_matrix_table(hm))
        if hm.breaches:
            parts.append("<h3>breaches of this series</h3>")
            parts.append(_breach_rows(hm.breaches, heatmap_of))
    parts.append("<h2>all breaches</h2>")
    if breaches:
        parts.append(_breach_rows(breaches, heatmap_of))
    else:
        parts.append("<p>none on <code>tailguard.breaches</code>.</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def to_json(
    heatmaps: Sequence[StageHeatmap],
    rendered: Mapping[str, str],
    *,
    window: str,
    generated_ms: int,
) -> str:
    """``heatmap.json``: every matrix built (``png`` names the rendered ones, else null)."""
    doc = {
        "format": "tailguard.report.heatmap/1",
        "generated_ms": generated_ms,
        "window": window,
        "stat": "p99",
        "unit": "ms",
        "series": [{**hm.to_dict(), "png": rendered.get(hm.key)} for hm in heatmaps],
    }
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


@dataclass(frozen=True, slots=True)
class ReportFiles:
    """What :func:`write_report` wrote."""

    out_dir: Path
    index: Path
    data: Path
    pngs: dict[str, Path]
    #: Keys of every series with stage data (matching the filter), rendered or not.
    candidates: list[str]


def write_report(
    out_dir: Path,
    heatmaps: Sequence[StageHeatmap],
    breach_records: Iterable[Mapping[str, Any]] = (),
    *,
    window: str = "1m",
    patterns: Sequence[str] = (),
    top: int | None = 10,
    generated_ms: int | None = None,
) -> ReportFiles:
    """Render the selected heatmaps and write PNGs, ``index.html`` and ``heatmap.json``.

    Raises :class:`NoStageData` when there is nothing to draw.
    """
    if not heatmaps:
        msg = (
            f"no per-stage latency in the final {window} snapshots on tailguard.sli: the events "
            "need stages_ms and the worker must publish per-stage digests (SliSnapshot.stages_ms); "
            "check `tailguard tail tailguard.sli --from-beginning -n 1`"
        )
        raise NoStageData(msg)
    candidates = select(heatmaps, patterns, top=None)
    if not candidates:
        known = ", ".join(h.key for h in heatmaps[:10])
        more = f" (and {len(heatmaps) - 10} more)" if len(heatmaps) > 10 else ""
        msg = (
            f"no series with stage data matches --series {' '.join(patterns)}; "
            f"series with stage data: {known}{more}"
        )
        raise NoStageData(msg)
    chosen = candidates if top is None else candidates[:top]
    now_ms = generated_ms if generated_ms is not None else int(datetime.now(UTC).timestamp() * 1000)
    names = slugs(h.key for h in heatmaps)
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs: dict[str, Path] = {}
    for hm in chosen:
        pngs[hm.key] = render_png(hm, out_dir / f"heatmap-{names[hm.key]}.png")
    note = ""
    if len(chosen) < len(candidates):
        note = (
            f"{len(chosen)} of {len(candidates)} series drawn: the top {len(chosen)} by worst "
            "stage P99 growth (worst P99 / median P99 of the stage); heatmap.json has them all."
        )
    keys = {h.key for h in candidates}
    breaches = [b for b in collect_breaches(breach_records) if not patterns or b.series_key in keys]
    index = out_dir / "index.html"
    index.write_text(
        render_html(
            [(hm, pngs[hm.key]) for hm in chosen],
            breaches,
            window=window,
            generated_ms=now_ms,
            note=note,
        ),
        encoding="utf-8",
    )
    data = out_dir / "heatmap.json"
    data.write_text(
        to_json(
            candidates,
            {k: p.name for k, p in pngs.items()},
            window=window,
            generated_ms=now_ms,
        ),
        encoding="utf-8",
    )
    return ReportFiles(
        out_dir=out_dir, index=index, data=data, pngs=pngs, candidates=[h.key for h in candidates]
    )
