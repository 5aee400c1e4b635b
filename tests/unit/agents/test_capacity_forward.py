"""The capacity forwarder's messages: one per partition and batch, in bounded chunks."""

from hypothesis import given
from hypothesis import strategies as st
from tailguard.agents.capacity import _chunks, _decode_message, _encode, _Groups, _messages


def row(ts: int) -> tuple:
    return (ts, 400.0, 180.0, 10, True, False, "i1", "h1", [0], [], None, "")


def test_a_grouped_message_round_trips() -> None:
    groups = [("chat", "llama", [row(1), row(2)]), ("chat", "qwen", [row(3)])]
    back = _decode_message(_encode(_Groups(groups)))
    assert isinstance(back, _Groups)
    assert back.groups == groups


def test_a_message_of_an_older_forwarder_still_decodes_as_rows() -> None:
    # Before grouping, a message held one deployment's rows (named by its key); after
    # an upgrade the topic may still hold some.
    old = _encode([row(1), row(2)])
    assert _decode_message(old) == [row(1), row(2)]


@given(
    sizes=st.lists(st.integers(min_value=1, max_value=50), max_size=30),
    max_rows=st.integers(min_value=1, max_value=40),
)
def test_chunks_keep_every_row_in_order_and_stay_within_the_bound(
    sizes: list[int], max_rows: int
) -> None:
    groups, ts = [], 0
    for i, n in enumerate(sizes):
        groups.append(("svc", f"m{i}", [row(ts + j) for j in range(n)]))
        ts += n
    chunks = list(_chunks(groups, max_rows))
    assert all(0 < sum(len(r) for _, _, r in c) <= max_rows for c in chunks)
    # Every deployment's rows, in order, across the chunks.
    flat: dict[str, list[tuple]] = {}
    for c in chunks:
        for _, model, rows in c:
            assert rows
            flat.setdefault(model, []).extend(rows)
    assert flat == {m: r for _, m, r in groups}
    # Only the last chunk may be short.
    assert all(sum(len(r) for _, _, r in c) == max_rows for c in chunks[:-1])


def test_messages_of_long_rows_are_halved_until_they_fit_the_byte_bound() -> None:
    long = "x" * 5_000  # an instance name far longer than usual
    groups = [("svc", f"m{i}", [(*row(i)[:6], long, *row(i)[7:])]) for i in range(40)]
    values = list(_messages(groups, max_rows=2_000, max_bytes=50_000))
    assert len(values) > 1
    assert all(len(v) <= 50_000 for v in values)
    back = [g for v in values for g in _decode_message(v).groups]
    assert back == groups  # every row once, in order
