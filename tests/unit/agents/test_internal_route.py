"""``route``: validated events → per-partition columnar messages, and back."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.agents.internal import (
    columns_by_partition,
    decode_groups,
    group_columns,
    partition_for,
    route,
    series_index,
    series_key,
    served_by,
    take_requests,
)
from tailguard.schemas import InferenceEvent
from tailguard.streams.columns import Columns
from tailguard.streams.served import ServedGpus


def event(
    i: int, service: str, model: str, gaps: int = 3, host: str | None = None
) -> InferenceEvent:
    return InferenceEvent(
        event_id=f"e{i}",
        ts_ms=1_700_000_000_000 + i,
        service=service,
        model=model,
        status="ok",
        e2e_ms=100.0 + i,
        ttft_ms=10.0 + i,
        output_tokens=gaps + 1,
        itl_ms=[float(g) for g in range(gaps)],
        trace_id=f"{i:032x}",
        host=host,
        gpu_ids=[i % 2] if host else None,
    )


def unpack(messages: list[tuple[int, bytes]]) -> dict[str, list[tuple[str, int, int]]]:
    """series key → [(event hash-free id, partition, offset)] in the order forwarded."""
    out: dict[str, list[tuple[float, int, int]]] = {}
    for partition, value in messages:
        groups = decode_groups(value)
        for g, series in enumerate(groups.series):
            key = series_key(*series)
            assert partition_for(key, 4) == partition
            lo, hi = int(groups.bounds[g]), int(groups.bounds[g + 1])
            cols = groups.cols
            out.setdefault(key, []).extend(
                zip(
                    cols.e2e[lo:hi].tolist(),
                    cols.part[lo:hi].tolist(),
                    cols.offset[lo:hi].tolist(),
                    strict=True,
                )
            )
    return out  # type: ignore[return-value]


@settings(max_examples=60, deadline=None)
@given(
    picks=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 30)), min_size=1, max_size=300),
    budget=st.sampled_from([400, 2_000, 900_000]),
)
def test_every_event_is_forwarded_once_to_its_series_partition_in_input_order(
    picks: list[tuple[int, int]], budget: int
) -> None:
    events, positions = [], []
    for i, (s, gaps) in enumerate(picks):
        events.append(event(i, f"svc{s % 3}", f"m{s // 3}", gaps=gaps))
        positions.append(((i // 3) % 2, i // 3))  # three consecutive events per input message
    messages = route(events, positions, 4, max_bytes=budget)
    got = unpack(messages)
    expected: dict[str, list[tuple[float, int, int]]] = {}
    for ev, (p, o) in zip(events, positions, strict=True):
        key = series_key(ev.service, ev.model, ev.variant, ev.tenant)
        expected.setdefault(key, []).append((ev.e2e_ms, p, o))
    assert got == expected
    # A series is cut only between input messages: all its events of one input
    # message travel in one forwarded message.
    where: dict[tuple[str, int, int], int] = {}
    for n, (_, value) in enumerate(messages):
        groups = decode_groups(value)
        for g, series in enumerate(groups.series):
            lo, hi = int(groups.bounds[g]), int(groups.bounds[g + 1])
            for p, o in zip(
                groups.cols.part[lo:hi].tolist(), groups.cols.offset[lo:hi].tolist(), strict=True
            ):
                assert where.setdefault((series_key(*series), p, o), n) == n


def test_gpus_travel_with_their_series_group() -> None:
    events = [event(i, "svc", "m", host="gpu-node-07") for i in range(4)]
    events.append(event(9, "other", "m"))
    messages = route(events, [(0, i) for i in range(5)], 1)
    ((_, value),) = messages
    groups = decode_groups(value)
    g = groups.series.index(("svc", "m", "default", "default"))
    assert sorted((gg, h, gpu) for gg, h, gpu, _ in groups.gpus) == [
        (g, "gpu-node-07", 0),
        (g, "gpu-node-07", 1),
    ]
    newest = {gpu: ts for _, _, gpu, ts in groups.gpus}
    assert newest == {0: events[2].ts_ms, 1: events[3].ts_ms}


def test_a_corrupt_internal_record_is_refused() -> None:
    ((_, value),) = route([event(1, "svc", "m")], [(0, 0)], 1)
    with pytest.raises(ValueError):
        decode_groups(value[:-5])
    assert np.all(decode_groups(value).bounds == [0, 1])


placements = st.lists(
    st.tuples(
        st.integers(0, 3),  # series index
        st.sampled_from(["", "h1", "h2", "h3"]),  # host ("": none)
        st.lists(st.integers(0, 9), max_size=3),  # gpu_ids
        st.integers(0, 50),  # ts offset
    ),
    max_size=60,
)


@given(placements)
@settings(max_examples=200, deadline=None)
def test_the_newest_event_per_series_host_and_gpu_is_found(
    rows: list[tuple[int, str, list[int], int]],
) -> None:
    from types import SimpleNamespace

    from tailguard.agents.internal import _served

    events = [
        SimpleNamespace(host=host or None, gpu_ids=ids, ts_ms=1_000 + ts)
        for _, host, ids, ts in rows
    ]
    expected: dict[tuple[int, str, int], int] = {}
    for g, host, ids, ts in rows:
        for gpu in ids if host else []:
            expected[(g, host, gpu)] = max(expected.get((g, host, gpu), 0), 1_000 + ts)
    gid = np.array([g for g, *_ in rows], dtype=np.int64)
    assert _served(events, gid) == expected  # type: ignore[arg-type]


@settings(max_examples=80, deadline=None)
@given(
    picks=st.lists(
        st.tuples(
            st.integers(0, 6),  # series
            st.integers(0, 3),  # input partition
            st.integers(0, 4),  # ITL gaps
            st.sampled_from([None, "h0", "h1"]),  # host
        ),
        min_size=1,
        max_size=120,
    ),
    every_other=st.booleans(),
)
def test_requests_grouped_per_partition_read_as_each_partition_taken_alone(
    picks: list[tuple[int, int, int, str | None]], every_other: bool
) -> None:
    # One sort and one take for all partitions (a slice each) must give what
    # taking each partition's requests on its own gives: the same series in the
    # same order, each one's requests in input order, and the GPUs that served it
    # (a series fed from two partitions has them in both).
    events = [
        event(i, f"svc{s}", f"m{s % 2}", gaps, host) for i, (s, _, gaps, host) in enumerate(picks)
    ]
    positions = [(part, 100 + i) for i, (_, part, _, _) in enumerate(picks)]
    gid, series = series_index(events)
    cols = Columns.from_events(events, positions)
    served = served_by(
        gid, ServedGpus.of([e.host for e in events], [e.gpu_ids for e in events]), cols.ts
    )
    rows = np.arange(len(events))[::2] if every_other else np.arange(len(events))
    got = columns_by_partition(cols, gid, series, served, rows)

    part = cols.part[rows]
    assert sorted(got) == sorted(set(part.tolist()))
    for partition, groups in got.items():
        mine = rows[part == partition]
        mine = mine[np.argsort(gid[mine], kind="stable")]
        alone = group_columns(*take_requests(cols, gid, series, served, mine))
        assert groups.series == alone.series
        assert groups.bounds.tolist() == alone.bounds.tolist()
        for name in ("ts", "e2e", "ttft", "itl", "itl_len", "ids", "part", "offset"):
            assert getattr(groups.cols, name).tolist() == getattr(alone.cols, name).tolist(), name
        assert list(groups.cols.traces) == list(alone.cols.traces)
        assert sorted(groups.gpus) == sorted(alone.gpus)
