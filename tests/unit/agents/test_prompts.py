"""The prompt registry as a worker applies it, request outcomes, and the snapshot record."""

import json

import jsonschema
import numpy as np
import pytest
from tailguard.agents.prompts import PromptRegistry, Row, group_snapshot, outcome_of
from tailguard.schemas import DeadLetterReason, InferenceEvent, Reject
from tailguard.schemas.generate import SCHEMA_DIR
from tailguard.schemas.prompts import PROMPT_SLI_SCHEMA
from tailguard.streams.prompt_groups import PromptGrouper
from tailguard.streams.prompt_sli import CANCELLED, ERROR, GOOD, SLOW, GroupSli
from tailguard.streams.sli import Thresholds

from tailguard.prompts import build_record


def _toy(texts):  # type: ignore[no-untyped-def]
    return np.array([[float(p) for p in t.split(",")] for t in texts], dtype=np.float32)


@pytest.fixture
def registry() -> tuple[PromptRegistry, list[tuple[Reject, int]]]:
    rejects: list[tuple[Reject, int]] = []
    reg = PromptRegistry(
        PromptGrouper(0.9, _toy), on_reject=lambda r, raw, off: rejects.append((r, off))
    )
    return reg, rejects


def _raw(version: str, text: str | None, **kw: object) -> bytes:
    rec = build_record(text or "x", version, hash_only=text is None, **kw)  # type: ignore[arg-type]
    return json.dumps(rec).encode()


def test_records_are_grouped_in_offset_order(registry) -> None:  # type: ignore[no-untyped-def]
    reg, rejects = registry
    assert reg.apply(b"a", _raw("a", "1,0"), 0) == "pg-a"
    assert reg.apply(b"b", _raw("b", "1,0.1"), 1) == "pg-a"
    assert reg.apply(b"h", _raw("h", None, parent="b"), 2) == "pg-a"
    assert reg.apply(b"c", _raw("c", "0,1"), 3) == "pg-c"
    assert reg.group_of("h") == "pg-a" and reg.group_of("zzz") is None
    assert reg.members("pg-a") == ["a", "b", "h"]
    assert reg.applied_offset == 3 and not rejects


def test_bad_records_are_dead_lettered_and_change_nothing(registry) -> None:  # type: ignore[no-untyped-def]
    reg, rejects = registry
    reg.apply(b"a", _raw("a", "1,0"), 0)
    assert reg.apply(b"x", b"{oops", 1) is None
    assert reg.apply(b"y", b'{"prompt_version": "y"}', 2) is None
    assert reg.apply(b"other", _raw("z", "0,1"), 3) is None  # key is not its version
    assert [(r.reason, off) for r, off in rejects] == [
        (DeadLetterReason.MALFORMED_JSON, 1),
        (DeadLetterReason.MISSING_FIELD, 2),
        (DeadLetterReason.INCONSISTENT, 3),
    ]
    assert reg.groups() == {"pg-a": ["a"]}
    assert reg.stats.rejected == 3 and reg.applied_offset == 3


def test_a_version_is_immutable_and_tombstones_remove_nothing(registry) -> None:  # type: ignore[no-untyped-def]
    reg, _ = registry
    reg.apply(b"a", _raw("a", "1,0"), 0)
    assert reg.apply(b"a", _raw("a", "0,1"), 1) == "pg-a"
    assert reg.apply(b"a", None, 2) is None
    assert reg.group_of("a") == "pg-a"
    assert reg.records["a"].text == "1,0"


def _event(**kw: object) -> InferenceEvent:
    base: dict[str, object] = dict(
        event_id="e",
        ts_ms=1,
        service="s",
        model="m",
        status="ok",
        e2e_ms=1000.0,
        ttft_ms=100.0,
        output_tokens=11,
    )
    base.update(kw)
    return InferenceEvent(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, GOOD),
        ({"ttft_ms": 900.0}, SLOW),
        ({"e2e_ms": 2000.0, "ttft_ms": 100.0}, SLOW),  # TPOT 190 ms > 120 ms
        ({"status": "timeout"}, ERROR),
        ({"status": "rejected"}, ERROR),
        ({"status": "cancelled", "ttft_ms": 5000.0}, CANCELLED),
    ],
)
def test_outcome_follows_the_series_thresholds(kw: dict[str, object], expected: int) -> None:
    assert outcome_of(_event(**kw), Thresholds()) == expected


def test_snapshot_validates_against_the_shipped_schema() -> None:
    st = GroupSli(window_ms=60_000)
    st.add(1_700_000_000_000, "a", GOOD, 120.0)
    st.add(1_700_000_000_500, "b", SLOW, 950.0)
    (window,) = st.open.values()
    snap = group_snapshot(
        "chat", "llama", "pg-a", ["a", "b"], window, st, final=False, now_ms=1_700_000_001_000
    )
    doc = json.loads((SCHEMA_DIR / f"{PROMPT_SLI_SCHEMA}.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(doc).validate(snap)
    assert snap["count"] == 2 and snap["bad"] == 1 and snap["slo_compliance"] == 0.5
    assert snap["versions"] == {"a": {"count": 1, "bad": 0}, "b": {"count": 1, "bad": 1}}
    assert snap["window_end_ms"] - snap["window_start_ms"] == 60_000
    again = group_snapshot("chat", "llama", "pg-a", ["a", "b"], window, st, final=False, now_ms=0)
    assert again["event_id"] == snap["event_id"]


T0, MINUTE = 1_699_995_600_000, 60_000
GROUPS = {"a1": "pg-a1", "a2": "pg-a1", "b1": "pg-b1"}


@pytest.fixture
def folder():  # type: ignore[no-untyped-def]
    """A fold of one message into a dict table, written back as the agent does."""
    from tailguard.agents.prompts import PromptStats, _encode_meta, fold_rows

    table: dict[bytes, bytes] = {}
    stats = PromptStats()

    def load(key: bytes) -> GroupSli:
        raw = table.get(key)
        return GroupSli.from_bytes(raw) if raw else GroupSli(MINUTE, 0)

    def fold(rows: list[Row], *, write: bool = True):  # type: ignore[no-untyped-def]
        out = fold_rows(table, "chat|llama", rows, GROUPS.get, load, stats)
        if write:
            for group, st in out.states.items():
                table[f"chat|llama\x1f{group}".encode()] = st.to_bytes()
            table[b"chat|llama\x1f"] = _encode_meta(out.meta)
        return out

    return fold, stats


def test_fold_closes_a_quiet_groups_window_when_the_deployment_moves_on(folder) -> None:  # type: ignore[no-untyped-def]
    fold, stats = folder
    t0, minute = T0, MINUTE
    first = fold(
        [
            Row(t0 + 1, "a1", GOOD, 100.0),
            Row(t0 + 2, "a2", SLOW, 900.0),
            Row(t0 + 3, "b1", GOOD, 50.0),
        ]
    )
    assert not first.closed and first.meta == (t0 + 3, ["pg-a1", "pg-b1"])
    # only pg-b1 has traffic in the next minute; pg-a1's window closes all the same
    later = fold([Row(t0 + minute + 5, "b1", GOOD, 60.0), Row(t0 + 5, "zz", ERROR, None)])
    closed = {(g, w.start_ms): w.tally for g, w, _ in later.closed}
    assert set(closed) == {("pg-a1", t0), ("pg-b1", t0), ("pg-zz", t0)}
    assert closed[("pg-a1", t0)].versions == {"a1": [1, 0], "a2": [1, 1]}
    assert later.meta == (t0 + minute + 5, ["pg-b1"])
    assert stats.unregistered_rows == 1 and stats.rows == 5


def _message(part: int, offset: int, *rows: tuple[int, str, int, float | None]) -> list[Row]:
    return [Row(*r, part, offset) for r in rows]


def test_a_batch_re_forwarded_after_a_crash_is_counted_once(folder) -> None:  # type: ignore[no-untyped-def]
    fold, stats = folder
    m1 = _message(0, 10, (T0 + 1, "a1", GOOD, 100.0), (T0 + 2, "b1", SLOW, 900.0))
    m2 = _message(0, 11, (T0 + 3, "a2", ERROR, None))
    m3 = _message(1, 4, (T0 + 4, "a1", GOOD, 80.0), (T0 + 5, "zz", GOOD, 70.0))
    once = fold(m1 + m2 + m3)
    counts = {g: st.total.summary() for g, st in once.states.items()}
    # the ingest agent re-reads its uncommitted input and forwards it again, now
    # together with input it had not forwarded yet
    m4 = _message(1, 5, (T0 + 6, "b1", GOOD, 60.0))
    again = fold(m3 + m1 + m4 + m2)
    assert stats.replayed == 5 and stats.rows == 11
    assert again.states["pg-b1"].total.requests == 2
    for group in ("pg-a1", "pg-zz"):
        assert again.states[group].total.summary() == counts[group]
    # the prompt agent re-reads an internal message whose state was written
    assert fold(m4).states["pg-b1"].total.requests == 2


def test_a_fold_whose_state_was_not_written_counts_on_replay(folder) -> None:  # type: ignore[no-untyped-def]
    fold, stats = folder
    rows = _message(3, 7, (T0 + 1, "a1", GOOD, 100.0), (T0 + 2, "a2", SLOW, 900.0))
    fold(rows, write=False)  # crashed before the table write
    assert fold(rows).states["pg-a1"].total.requests == 2 and stats.replayed == 0


def test_rows_of_an_older_forwarder_decode_without_positions() -> None:
    from tailguard.agents.prompts import _decode_rows, _encode

    old = _decode_rows(b'[[1700000000000,"a1",1,250.5],[1700000000001,"b1",3,null]]')
    assert old == [Row(1_700_000_000_000, "a1", SLOW, 250.5), Row(1_700_000_000_001, "b1", 3, None)]
    assert (old[0].part, old[0].offset) == (-1, -1)
    row = Row(5, "v", GOOD, 1.0, 2, 99)
    assert _encode([row]) == b'[[5,"v",0,1.0,2,99]]'
    assert _decode_rows(_encode([row])) == [row]
