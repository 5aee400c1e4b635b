"""The capacity forwarder's messages: one per partition and batch, each deployment's
requests as columns in bounded chunks, every request with its input position."""

import math
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tailguard.agents.capacity_columns import CapacityRows, chunks, decode_message, messages
from tailguard.agents.capacity_rows import Groups, encode


def row(ts: int, **changes: Any) -> tuple:
    fields = {
        "ts": ts,
        "e2e": 400.0,
        "ttft": 180.0,
        "tokens": 10,
        "ok": True,
        "warm": False,
        "instance": "i1",
        "host": "h1",
        "gpus": [0],
        "experts": [],
        "sim": None,
        "index": "default",
    }
    fields.update(changes)
    return tuple(fields.values())


def rows_of(*tuples: tuple) -> CapacityRows:
    return CapacityRows.from_rows(list(tuples))


def test_a_message_round_trips_each_deployments_columns_and_input_positions() -> None:
    llama = [row(1), row(2, ttft=None, ok=False, warm=True, sim=0.7, index="kb", experts=[3])]
    qwen = [row(3, instance="", host="", gpus=[], tokens=0)]
    groups = [
        ("chat", "llama", rows_of(*llama), [(0, 17, 0, 2)]),
        ("chat", "qwen", rows_of(*qwen), [(1, 4, 0, 1)]),
    ]
    (value,) = messages(groups, max_rows=2_000, max_bytes=900_000)
    back = decode_message(value)
    assert [(s, m, r.as_rows(), runs) for s, m, r, runs in back] == [
        ("chat", "llama", llama, [(0, 17, 0, 2)]),
        ("chat", "qwen", qwen, [(1, 4, 0, 1)]),
    ]
    assert math.isnan(back[0][2].ttft[1]) and back[0][2].warm.tolist() == [False, True]


def test_text_and_list_columns_no_request_has_are_left_out() -> None:
    plain = CapacityRows(
        np.array([1, 2]),
        np.array([5.0, 6.0]),
        np.array([1.0, 2.0]),
        np.array([3, 4]),
        np.array([True, True]),
        np.array([False, False]),
    )
    (value,) = messages([("chat", "m", plain, [])], max_rows=10, max_bytes=10_000)
    ((_, _, back, _),) = decode_message(value)
    assert back.instance is None and not back.gpus and back.similarity is None
    assert back.as_rows() == plain.as_rows()


def test_messages_of_older_forwarders_still_decode() -> None:
    # One tuple per request: MessagePack with runs; before that JSON without runs;
    # before grouping, one deployment's tuples named by the message key.
    runs = [[(0, 17, 0, 2)]]
    grouped = decode_message(encode(Groups([("chat", "llama", [row(1), row(2)])], runs)))
    assert [(s, m, r.as_rows(), p) for s, m, r, p in grouped] == [
        ("chat", "llama", [row(1), row(2)], [(0, 17, 0, 2)])
    ]
    json_grouped = decode_message(msgspec.json.encode({"groups": [("chat", "llama", [row(1)])]}))
    assert [(s, m, r.as_rows(), p) for s, m, r, p in json_grouped] == [
        ("chat", "llama", [row(1)], [])
    ]
    bare = decode_message(msgspec.json.encode([row(1), row(2)]), b"chat|llama")
    assert [(s, m, r.as_rows()) for s, m, r, _ in bare] == [("chat", "llama", [row(1), row(2)])]
    with pytest.raises(msgspec.DecodeError):
        decode_message(b"\xc1 not a message")


#: Positions in a deployment's array on the wire (see capacity_columns).
TS, E2E, HOST = 2, 3, 9


@pytest.mark.parametrize(
    ("at", "cut"),
    [
        (HOST, lambda hosts: hosts[:1]),  # one host for two requests
        (TS, lambda ts: ts[:-3]),  # a time cut in the middle of its 8 bytes
        (E2E, lambda e2e: e2e + bytes(8)),  # a third E2E for two requests
    ],
)
def test_columns_that_disagree_in_length_are_refused(at: int, cut: Any) -> None:
    (value,) = messages([("chat", "m", rows_of(row(1), row(2)), [])], 10, 10_000)
    message = msgspec.msgpack.decode(value)
    deployment = message["deployments"][0]
    deployment[at] = cut(deployment[at])
    with pytest.raises(msgspec.DecodeError):
        decode_message(msgspec.msgpack.encode(message))


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
                rows_of(*(row(ts + j) for j in range(n))),
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
            rows.setdefault(model, []).extend(r.as_rows())
            where.setdefault(model, []).extend(
                (p, o, first + j) for p, o, first, k in runs for j in range(k)
            )
    assert rows == {m: r.as_rows() for _, m, r, _ in groups}
    assert where == {
        m: [(p, o, j) for p, o, _, k in runs for j in range(k)] for _, m, _, runs in groups
    }


def test_messages_of_long_names_are_halved_until_they_fit_the_byte_bound() -> None:
    long = "x" * 5_000  # an instance name far longer than usual
    groups = [("svc", f"m{i}", rows_of(row(i, instance=long)), [(0, i, 0, 1)]) for i in range(40)]
    values = list(messages(groups, max_rows=2_000, max_bytes=50_000))
    assert len(values) > 1
    assert all(len(v) <= 50_000 for v in values)
    back = [group for v in values for group in decode_message(v)]
    # Every request once, in order, with its input position.
    assert [(s, m, r.as_rows(), p) for s, m, r, p in back] == [
        (s, m, r.as_rows(), p) for s, m, r, p in groups
    ]


def test_taking_ranges_keeps_the_requests_in_them_in_order() -> None:
    rows = rows_of(*(row(ts, tokens=ts % 7) for ts in range(10)))
    assert rows.take([(0, 3), (3, 10)]) is rows  # adjacent ranges: all of it, no copy
    taken = rows.take([(1, 3), (3, 4), (6, 6), (8, 10)])
    assert taken.as_rows() == [row(ts, tokens=ts % 7) for ts in (1, 2, 3, 8, 9)]
    assert len(rows.take([])) == 0
