"""Rendering: the PNG is a real PNG of sensible size, the HTML and JSON carry the numbers."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tailguard.report import (
    NoStageData,
    ReportFiles,
    build_heatmaps,
    render_png,
    write_report,
)

from .conftest import KEY, MINUTE_MS, SERIES, T0_MS, MakeSnapshot, incident_minutes

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
Incident = tuple[list[dict[str, Any]], list[dict[str, Any]]]


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the IHDR chunk, which a PNG must start with."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE
    assert head[12:16] == b"IHDR"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def red_pixels(path: Path) -> int:
    """Pixels of the breach colour (#e3000f), give or take antialiasing."""
    with Image.open(path) as im:
        rgb = np.asarray(im.convert("RGB")).astype(int)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    return int(((r > 200) & (g < 40) & (b < 60)).sum())


def test_the_png_is_a_valid_png_wider_than_tall(incident: Incident, tmp_path: Path) -> None:
    (hm,) = build_heatmaps(*incident)

    path = render_png(hm, tmp_path / "h.png")

    width, height = png_size(path)
    assert 1_000 < width < 3_000 and 300 < height < 900
    with Image.open(path) as im:
        im.verify()


def test_more_windows_make_a_wider_png_up_to_a_cap(tmp_path: Path) -> None:
    sizes = []
    for n in (10, 30, 600):
        (hm,) = build_heatmaps(*incident_minutes(n))
        sizes.append(png_size(render_png(hm, tmp_path / f"h{n}.png"))[0])

    assert sizes[0] < sizes[1] < sizes[2] <= 22 * 110


def test_breach_intervals_are_drawn_in_red_and_only_when_there_is_one(
    incident: Incident, tmp_path: Path
) -> None:
    snaps, breaches = incident
    (with_breach,) = build_heatmaps(snaps, breaches)
    (without,) = build_heatmaps(snaps)

    assert red_pixels(render_png(with_breach, tmp_path / "a.png")) > 1_000
    assert red_pixels(render_png(without, tmp_path / "b.png")) == 0


def test_a_single_window_and_a_zero_p99_still_render(
    make_snapshot: MakeSnapshot, tmp_path: Path
) -> None:
    (hm,) = build_heatmaps([make_snapshot(T0_MS, {"tokenize": 0.0, "prefill": 200.0})])

    assert png_size(render_png(hm, tmp_path / "one.png"))[0] > 0


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> ReportFiles:
    """The report of the incident, written once for the tests that read it."""
    snaps, breaches = incident_minutes()
    out = tmp_path_factory.mktemp("report") / "out"
    return write_report(out, build_heatmaps(snaps, breaches), breaches, generated_ms=T0_MS)


def test_write_report_writes_pngs_html_and_json(written: ReportFiles) -> None:
    out = written.out_dir
    png = out / "heatmap-chat-llama-3.1-8b-default-default.png"

    assert written.pngs == {KEY: png}
    assert png_size(png)[0] > 0
    assert written.index == out / "index.html"
    assert written.data == out / "heatmap.json"
    assert sorted(p.name for p in out.iterdir()) == sorted(["heatmap.json", "index.html", png.name])


def test_the_html_page_is_self_contained_and_holds_the_matrix_and_breaches(
    written: ReportFiles,
) -> None:
    page = written.index.read_text(encoding="utf-8")

    assert "data:image/png;base64,iVBORw0KGgo" in page  # the PNG itself, embedded
    for stage in ("tokenize", "queue", "prefill", "decode", "detokenize"):
        assert f'<td class="stage">{stage}</td>' in page
    # prefill P99 before (≈200 ms) and during the breach (≈1,500 ms), as printed in the cells
    assert ">196</td>" in page and ">1,530</td>" in page and ">1,470</td>" in page
    assert ">12:13</th>" in page and 'class="breach" title="2024-06-01 12:14 UTC' in page
    assert "<td>b-1</td>" in page and "<td>ttft-p99</td>" in page
    assert "prefill 200→1,530 ms" in page
    assert "all breaches" in page


def test_the_json_holds_every_matrix_with_its_breaches(written: ReportFiles) -> None:
    doc = json.loads(written.data.read_text())

    assert doc["window"] == "1m" and doc["stat"] == "p99" and doc["generated_ms"] == T0_MS
    (series,) = doc["series"]
    assert series["series"] == SERIES
    assert series["stages"] == ["tokenize", "queue", "prefill", "decode", "detokenize"]
    assert series["minutes"][:2] == [T0_MS + MINUTE_MS, T0_MS + 2 * MINUTE_MS]
    assert len(series["minutes"]) == 30
    assert series["p99_ms"][2][12] == pytest.approx(1_500.0)
    assert series["p99_ms"][4][0] == pytest.approx(1.2)
    assert series["png"] == "heatmap-chat-llama-3.1-8b-default-default.png"
    (b,) = series["breaches"]
    assert (b["breach_id"], b["state"], b["resolved_ms"]) == (
        "b-1",
        "resolved",
        T0_MS + 22 * MINUTE_MS,
    )
    assert b["top_stages"][0]["stage"] == "prefill"


def test_top_caps_the_drawings_but_the_json_keeps_every_series(
    make_snapshot: MakeSnapshot, tmp_path: Path
) -> None:
    snaps = []
    for service, jump in (("flat", 1.0), ("big", 8.0), ("mid", 3.0)):
        s = {**SERIES, "service": service}
        snaps += [
            make_snapshot(
                T0_MS + m * MINUTE_MS, {"prefill": 200.0 * (jump if m == 2 else 1)}, series=s
            )
            for m in range(3)
        ]

    files = write_report(tmp_path, build_heatmaps(snaps), top=1)

    assert [p.name for p in files.pngs.values()] == ["heatmap-big-llama-3.1-8b-default-default.png"]
    assert sorted(tmp_path.glob("*.png")) == list(files.pngs.values())
    doc = json.loads(files.data.read_text())
    assert [s["key"].split("/")[0] for s in doc["series"]] == ["big", "mid", "flat"]
    assert [s["png"] is not None for s in doc["series"]] == [True, False, False]
    assert "1 of 3 series drawn" in files.index.read_text()


def test_no_stage_data_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NoStageData, match="no per-stage latency in the final 1m snapshots"):
        write_report(tmp_path, [])
    assert list(tmp_path.iterdir()) == []


def test_a_series_filter_that_matches_nothing_names_the_series_there_are(
    incident: Incident, tmp_path: Path
) -> None:
    with pytest.raises(NoStageData, match=f"matches --series nope.*{KEY}"):
        write_report(tmp_path, build_heatmaps(*incident), patterns=["nope"])
