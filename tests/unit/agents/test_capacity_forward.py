"""The capacity forwarder's messages: one per partition and batch, in bounded chunks,
every row with the input position of its event."""

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tailguard.agents.capacity_rows import (
    Groups,
    chunks,
    decode_message,
    encode,
    messages,
    rows_by_deployment,
)
from tailguard.schemas import InferenceEvent


def row(ts: int) -> tuple:
    return (ts, 400.0, 180.0, 10, True, False, "i1", "h1", [0], [], None, "")


def test_a_grouped_message_round_trips_with_its_input_positions() -> None:
    groups = [("chat", "llama", [row(1), row(2)]), ("chat", "qwen", [row(3)])]
    runs = [[(0, 17, 0, 2)], [(1, 4, 0, 1)]]
    back = decode_message(encode(Groups(groups, runs)))
    assert isinstance(back, Groups)
    assert back.groups == groups and back.runs == runs


def test_messages_of_older_forwarders_still_decode() -> None:
    # Before input positions, a grouped message had no runs; before grouping, a
    # message held one deployment's rows (named by its key).
    # Both were JSON.
    grouped = decode_message(msgspec.json.encode({"groups": [("chat", "llama", [row(1)])]}))
    assert isinstance(grouped, Groups) and grouped.runs == []
    assert decode_message(msgspec.json.encode([row(1), row(2)])) == [row(1), row(2)]
    with pytest.raises(msgspec.DecodeError):
        decode_message(b"\xc1 not a message")


def event(i: int, model: str) -> InferenceEvent:
    fields: dict[str, Any] = {
        "event_id": f"e{i}",
        "ts_ms": 1_700_000_000_000 + i,
        "service": "chat",
        "model": model,
        "status": "ok",
        "e2e_ms": 400.0,
    }
    return InferenceEvent(**fields)


def test_each_deployments_rows_carry_runs_of_their_input_messages() -> None:
    # Two input messages on partition 0 and one on partition 3, deployments mixed.
    models = ["a", "b", "a", "a", "b", "a"]
    positions = [(0, 10), (0, 10), (0, 10), (0, 11), (0, 11), (3, 5)]
    events = [event(i, m) for i, m in enumerate(models)]
    by = rows_by_deployment(events, positions)
    assert [r[0] for r in by[("chat", "a")][0]] == [events[i].ts_ms for i in (0, 2, 3, 5)]
    assert by[("chat", "a")][1] == [(0, 10, 0, 2), (0, 11, 0, 1), (3, 5, 0, 1)]
    assert by[("chat", "b")][1] == [(0, 10, 0, 1), (0, 11, 0, 1)]


@given(
    sizes=st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=5), max_size=20),
    max_rows=st.integers(min_value=1, max_value=40),
)
def test_chunks_keep_every_row_and_its_position_in_order_within_the_bound(
    sizes: list[list[int]], max_rows: int
) -> None:
    # Deployment i holds runs of the given sizes (input messages 0, 1, … of partition i).
    groups, ts = [], 0
    for i, runs in enumerate(sizes):
        n = sum(runs)
        groups.append(
            (
                "svc",
                f"m{i}",
                [row(ts + j) for j in range(n)],
                [(i, o, 0, k) for o, k in enumerate(runs)],
            )
        )
        ts += n
    cut = list(chunks(groups, max_rows))
    assert all(0 < sum(len(r) for _, _, r, _ in c) <= max_rows for c in cut)
    assert all(sum(len(r) for _, _, r, _ in c) == max_rows for c in cut[:-1])
    # Every deployment's rows in order, each with its (partition, offset, index).
    rows: dict[str, list[tuple]] = {}
    where: dict[str, list[tuple[int, int, int]]] = {}
    for c in cut:
        for _, model, r, runs in c:
            assert r and sum(k for *_, k in runs) == len(r)
            rows.setdefault(model, []).extend(r)
            where.setdefault(model, []).extend(
                (p, o, first + j) for p, o, first, k in runs for j in range(k)
            )
    assert rows == {m: r for _, m, r, _ in groups}
    assert where == {
        m: [(p, o, j) for p, o, _, k in runs for j in range(k)] for _, m, _, runs in groups
    }


def test_messages_of_long_rows_are_halved_until_they_fit_the_byte_bound() -> None:
    long = "x" * 5_000  # an instance name far longer than usual
    groups = [
        ("svc", f"m{i}", [(*row(i)[:6], long, *row(i)[7:])], [(0, i, 0, 1)]) for i in range(40)
    ]
    values = list(messages(groups, max_rows=2_000, max_bytes=50_000))
    assert len(values) > 1
    assert all(len(v) <= 50_000 for v in values)
    decoded = [decode_message(v) for v in values]
    back = [g for d in decoded for g in d.groups]
    assert back == [(s, m, r) for s, m, r, _ in groups]  # every row once, in order
    assert [run for d in decoded for runs in d.runs for run in runs] == [
        (0, i, 0, 1) for i in range(40)
    ]
