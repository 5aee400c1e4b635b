"""Building the time × stage P99 matrix from snapshot dicts: pure, no broker."""

from typing import Any

import pytest

from tailguard.report import (
    Breach,
    build_heatmaps,
    collect_breaches,
    select,
    series_key,
    slugs,
)

from .conftest import KEY, MINUTE_MS, SERIES, T0_MS, MakeBreach, MakeSnapshot

M1, M2, M3, M4 = (T0_MS + i * MINUTE_MS for i in range(1, 5))


def test_rows_follow_the_pipeline_then_other_stages_alphabetically(
    make_snapshot: MakeSnapshot,
) -> None:
    snap = make_snapshot(
        M1,
        {
            "zeta": 1.0,
            "decode": 600.0,
            "alpha": 2.0,
            "tokenize": 3.0,
            "detokenize": 1.0,
            "prefill": 200.0,
            "queue": 10.0,
        },
    )

    (hm,) = build_heatmaps([snap])

    assert hm.stages == ["tokenize", "queue", "prefill", "decode", "detokenize", "alpha", "zeta"]
    assert hm.key == KEY == series_key(SERIES)
    assert hm.minutes == [M1]
    assert [row[0] for row in hm.p99] == [3.0, 10.0, 200.0, 600.0, 1.0, 2.0, 1.0]


def test_a_stage_missing_in_a_minute_is_a_blank_cell(make_snapshot: MakeSnapshot) -> None:
    snaps = [
        make_snapshot(M1, {"prefill": 200.0, "decode": 600.0}),
        make_snapshot(M2, {"prefill": 210.0}),  # no request reported decode
        make_snapshot(M3, {"prefill": 220.0, "decode": None}),  # reported with count 0
    ]

    (hm,) = build_heatmaps(snaps)

    assert hm.stages == ["prefill", "decode"]
    assert hm.p99 == [[200.0, 210.0, 220.0], [600.0, None, None]]


def test_a_minute_without_a_snapshot_is_a_blank_column_not_a_missing_one(
    make_snapshot: MakeSnapshot,
) -> None:
    snaps = [make_snapshot(M1, {"prefill": 200.0}), make_snapshot(M4, {"prefill": 230.0})]

    (hm,) = build_heatmaps(snaps)

    assert hm.step_ms == MINUTE_MS
    assert hm.minutes == [M1, M2, M3, M4]
    assert hm.p99 == [[200.0, None, None, 230.0]]


def test_provisional_snapshots_and_other_windows_are_ignored(
    make_snapshot: MakeSnapshot,
) -> None:
    snaps = [
        make_snapshot(M1, {"prefill": 200.0}),
        make_snapshot(M2, {"prefill": 9_999.0}, final=False),
        make_snapshot(M2, {"prefill": 8_888.0}, window="5m", window_s=300),
        make_snapshot(M2, {"prefill": 210.0}),
    ]

    (hm,) = build_heatmaps(snaps)

    assert hm.p99 == [[200.0, 210.0]]


def test_the_window_can_be_chosen_and_a_snapshot_without_a_name_matches_by_window_s(
    make_snapshot: MakeSnapshot,
) -> None:
    five = make_snapshot(M1, {"prefill": 300.0}, window="5m", window_s=300)
    unnamed: dict[str, Any] = {**make_snapshot(M2, {"prefill": 310.0}, window="5m", window_s=300)}
    unnamed["window"] = None

    (hm,) = build_heatmaps([five, unnamed], window="5m")

    assert hm.window == "5m"
    assert hm.step_ms == MINUTE_MS  # a 5 m window is published every minute
    assert hm.p99 == [[300.0, 310.0]]
    assert build_heatmaps([five, unnamed]) == []


def test_a_replayed_window_end_keeps_the_last_record(make_snapshot: MakeSnapshot) -> None:
    snaps = [make_snapshot(M1, {"prefill": 200.0}), make_snapshot(M1, {"prefill": 205.0})]

    (hm,) = build_heatmaps(snaps)

    assert hm.p99 == [[205.0]]


def test_series_without_any_stage_data_get_no_heatmap(make_snapshot: MakeSnapshot) -> None:
    other = {**SERIES, "service": "embed"}
    snaps = [
        make_snapshot(M1, {}, series=other),
        make_snapshot(M2, {"prefill": None}, series=other),
        make_snapshot(M1, {"prefill": 200.0}),
    ]

    assert [hm.key for hm in build_heatmaps(snaps)] == [KEY]
    assert build_heatmaps(snaps[:2]) == []


def test_one_heatmap_per_series_ordered_by_key(make_snapshot: MakeSnapshot) -> None:
    keys = []
    snaps = []
    for service in ("search", "chat", "agent"):
        s = {**SERIES, "service": service}
        keys.append(series_key(s))
        snaps.append(make_snapshot(M1, {"prefill": 200.0}, series=s))

    assert [hm.key for hm in build_heatmaps(snaps)] == sorted(keys)


def test_last_keeps_only_the_newest_columns(make_snapshot: MakeSnapshot) -> None:
    snaps = [make_snapshot(end, {"prefill": float(i)}) for i, end in enumerate((M1, M2, M3, M4))]

    (hm,) = build_heatmaps(snaps, last=2)

    assert hm.minutes == [M3, M4]
    assert hm.p99 == [[2.0, 3.0]]


def test_breach_records_fold_into_one_interval_per_breach_id(make_breach: MakeBreach) -> None:
    records = [
        make_breach("opened", M2, opened_ms=M2),
        make_breach("updated", M3, opened_ms=M2),
        make_breach("resolved", M4, opened_ms=M2, resolved_ms=M4),
        make_breach("opened", M3, opened_ms=M3, breach_id="b-2", slo="itl-p99"),
        {"state": "opened", "series": SERIES},  # no breach_id: not a breach record
    ]

    b1, b2 = collect_breaches(records)

    assert (b1.breach_id, b1.state, b1.opened_ms, b1.resolved_ms) == ("b-1", "resolved", M2, M4)
    assert (b2.breach_id, b2.slo, b2.state, b2.resolved_ms) == ("b-2", "itl-p99", "opened", None)
    assert b1.series_key == KEY


def test_the_newest_transition_names_the_state_whatever_the_reading_order(
    make_breach: MakeBreach,
) -> None:
    opened = make_breach("opened", M2, opened_ms=M2)
    resolved = make_breach("resolved", M4, opened_ms=M2, resolved_ms=M4)
    unnumbered = [{**r, "seq": None} for r in (resolved, opened)]

    (b,) = collect_breaches([resolved, opened])
    (c,) = collect_breaches(unnumbered)

    assert (b.state, b.resolved_ms) == ("resolved", M4)
    assert (c.state, c.resolved_ms) == ("resolved", M4)


def test_a_breach_covers_from_its_opening_up_to_but_not_including_its_resolution(
    make_snapshot: MakeSnapshot, make_breach: MakeBreach
) -> None:
    snaps = [make_snapshot(end, {"prefill": 200.0}) for end in (M1, M2, M3, M4)]
    resolved = [make_breach("resolved", M4, opened_ms=M2, resolved_ms=M4)]
    still_open = [make_breach("opened", M3, opened_ms=M3)]

    (closed,) = build_heatmaps(snaps, resolved)
    (open_,) = build_heatmaps(snaps, still_open)

    assert closed.columns_of(closed.breaches[0]) == [1, 2]
    assert open_.columns_of(open_.breaches[0]) == [2, 3]


def test_breaches_attach_only_to_their_own_series(
    make_snapshot: MakeSnapshot, make_breach: MakeBreach
) -> None:
    other = {**SERIES, "tenant": "acme"}
    snaps = [make_snapshot(M1, {"prefill": 1.0}), make_snapshot(M1, {"prefill": 1.0}, series=other)]

    theirs, mine = build_heatmaps(snaps, [make_breach("opened", M1, opened_ms=M1, series=other)])

    assert mine.key == KEY and mine.breaches == []
    assert theirs.key.endswith("/acme") and [b.breach_id for b in theirs.breaches] == ["b-1"]


def test_the_stage_that_blew_up_during_the_breach_ranks_first(
    incident: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    snaps, breaches = incident

    (hm,) = build_heatmaps(snaps, breaches)
    rises = hm.rises(hm.breaches[0])

    assert [r.stage for r in rises] == ["prefill", "queue", "decode"]
    assert rises[0].baseline_ms == pytest.approx(200.0, rel=0.03)
    assert rises[0].peak_ms == pytest.approx(1_530.0, rel=0.01)
    growth, stage = hm.growth()
    assert stage == "prefill" and growth == pytest.approx(7.65, rel=0.05)


def test_select_ranks_by_worst_stage_growth_and_caps_at_top(make_snapshot: MakeSnapshot) -> None:
    snaps = []
    for service, jump in (("flat", 1.0), ("big", 8.0), ("mid", 3.0)):
        s = {**SERIES, "service": service}
        snaps += [
            make_snapshot(end, {"prefill": 200.0 * (jump if end == M3 else 1.0)}, series=s)
            for end in (M1, M2, M3)
        ]
    heatmaps = build_heatmaps(snaps)

    assert [h.key.split("/")[0] for h in select(heatmaps, top=2)] == ["big", "mid"]
    assert [h.key.split("/")[0] for h in select(heatmaps, ["flat/*"])] == ["flat"]
    assert [h.key.split("/")[0] for h in select(heatmaps, ["mi", "flat*"], top=None)] == [
        "mid",
        "flat",
    ]
    assert select(heatmaps, ["nothing*"]) == []


def test_slugs_are_file_safe_and_unique() -> None:
    out = slugs(["Chat/Llama 3.1:8B/default/default", "a/b/c/d", "a-b/c/d", "a/b-c/d"])

    assert out["Chat/Llama 3.1:8B/default/default"] == "chat-llama-3.1-8b-default-default"
    assert len(set(out.values())) == 4
    assert all(set(v) <= set("abcdefghijklmnopqrstuvwxyz0123456789.-_") for v in out.values())


def test_breach_to_dict_round_trips_the_interval() -> None:
    b = Breach("x", KEY, dict(SERIES), "burn_rate", "ttft-p99", "page", "opened", M1, None)

    assert b.to_dict()["opened_ms"] == M1 and b.to_dict()["resolved_ms"] is None
    assert b.covers(M4) and not b.covers(M1 - 1)


def test_an_hour_window_is_gridded_at_its_five_minute_cadence(make_snapshot: MakeSnapshot) -> None:
    ends = [T0_MS + 5 * MINUTE_MS, T0_MS + 15 * MINUTE_MS]
    snaps = [make_snapshot(e, {"prefill": 1.0}, window="1h", window_s=3600) for e in ends]

    (hm,) = build_heatmaps(snaps, window="1h")

    assert hm.step_ms == 5 * MINUTE_MS
    assert hm.p99 == [[1.0, None, 1.0]]
