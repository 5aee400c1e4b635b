"""``RequestBatch``: rows and columnar messages read alike, as records would be."""

import dataclasses
import time
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tailguard.agents.internal import _served, series_index
from tailguard.agents.requests import RequestBatch
from tailguard.schemas import BatchInfo, CacheInfo, InferenceEvent, Limits
from tailguard.schemas.columnar import decode_columns, encode_columns
from tailguard.schemas.inputs import ExperimentTag
from tailguard.streams.columns import Columns

NOW = int(time.time() * 1000)


def request(i: int, kind: int) -> InferenceEvent:
    """Requests that differ in every field the batch reads, some rare parts included."""
    return InferenceEvent(
        event_id=f"e{i}",
        ts_ms=NOW - 60_000 + i,
        service=f"svc{kind % 2}",
        model=f"m{kind % 3}",
        tenant=f"t{kind % 4}",
        status=("ok", "error", "timeout", "cancelled")[kind % 4],
        e2e_ms=100.0 + i,
        ttft_ms=None if kind == 5 else 10.0 + i,
        output_tokens=None if kind == 5 else kind,
        itl_ms=[float(g) for g in range(kind)],
        trace_id=f"{i:032x}" if kind % 2 else None,
        host=f"h{kind}" if kind < 4 else None,
        gpu_ids=[kind % 2, 7] if kind < 4 else [],
        warmup=kind == 6,
        prompt_version="p1" if kind == 1 else None,
        experiment="exp" if kind == 2 else None,
        experiments=[ExperimentTag(experiment="x2", variant="b")] if kind == 3 else [],
        instance="vllm-0" if kind == 3 else None,
        expert_ids=[1, 2] if kind == 4 else [],
        rag_top1_similarity=0.5 if kind == 4 else None,
        cache=CacheInfo(prefix_hit_tokens=1, prefix_query_tokens=10) if kind == 7 else None,
        batch=BatchInfo(size=2, timed_out=True) if kind == 8 else None,
        stages_ms={"queue": 5.0 + i} if kind == 8 else {},
    )


def capacity_rows(
    events: list[InferenceEvent], positions: list[tuple[int, int]]
) -> dict[tuple[str, str], tuple[list[tuple[Any, ...]], list[tuple[int, int, int, int]]]]:
    """What the capacity agent reads of each deployment's requests, from records:
    fields with their defaults, and input positions as runs."""
    out: dict[tuple[str, str], tuple[list[Any], list[Any]]] = {}
    for ev, (part, offset) in zip(events, positions, strict=True):
        rows, runs = out.setdefault((ev.service, ev.model), ([], []))
        rows.append(
            (
                ev.ts_ms,
                ev.e2e_ms,
                ev.ttft_ms,
                ev.output_tokens or 0,
                ev.status == "ok",
                ev.warmup,
                ev.instance or "",
                ev.host or "",
                ev.gpu_ids,
                ev.expert_ids,
                ev.rag_top1_similarity,
                ev.rag_index or "default",
            )
        )
        if runs and runs[-1][:2] == (part, offset):
            runs[-1] = (part, offset, 0, runs[-1][3] + 1)
        else:
            runs.append((part, offset, 0, 1))
    return out


def capacity_of(batch: RequestBatch) -> dict[tuple[str, str], tuple[list[Any], list[Any]]]:
    return {(s, m): (rows.as_rows(), runs) for s, m, rows, runs in batch.capacity_groups()}


def columns_equal(a: Columns, b: Columns) -> None:
    for f in dataclasses.fields(Columns):
        if f.name.startswith("_"):
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y, err_msg=f.name)
        else:
            assert x == y, f.name


messages = st.lists(
    st.tuples(st.booleans(), st.lists(st.integers(0, 9), min_size=1, max_size=8)),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(plan=messages)
def test_a_batch_reads_as_the_records_it_holds(plan: list[tuple[bool, list[int]]]) -> None:
    batch = RequestBatch()
    events: list[InferenceEvent] = []
    positions: list[tuple[int, int]] = []
    for offset, (columnar, kinds) in enumerate(plan):
        evs = [request(len(events) + j, kind) for j, kind in enumerate(kinds)]
        if columnar:
            decoded = decode_columns(encode_columns(evs), now_ms=NOW, limits=Limits())
            assert not decoded.rejects
            batch.add_columns(offset % 3, offset, decoded)
        else:
            batch.add_rows(offset % 3, offset, evs)
        events += evs
        positions += [(offset % 3, offset)] * len(evs)
    gid, series = series_index(events)
    assert batch.series == series
    np.testing.assert_array_equal(batch.gid, gid)
    columns_equal(batch.columns(), Columns.from_events(events, positions))
    assert batch.served() == _served(events, gid)
    assert capacity_of(batch) == capacity_rows(events, positions)
    # Deployments in order of first request.
    assert list(capacity_of(batch)) == list(dict.fromkeys((e.service, e.model) for e in events))
    named = batch.named_rows()
    expected = [
        i
        for i, ev in enumerate(events)
        if (ev.experiment or ev.experiments or ev.prompt_version) and not ev.warmup
    ]
    assert named == expected
    assert batch.events(named) == [events[i] for i in named]
    assert batch.positions(named) == [positions[i] for i in named]


def test_rejected_requests_of_a_columnar_message_are_left_out() -> None:
    evs = [request(i, i) for i in range(4)]  # with hosts, GPUs, gaps
    future = InferenceEvent(**{**_fields(evs[1]), "ts_ms": NOW + 3_600_000})
    decoded = decode_columns(
        encode_columns([evs[0], future, evs[2], evs[3]]), now_ms=NOW, limits=Limits()
    )
    assert [r.index for r in decoded.rejects] == [1]
    batch = RequestBatch()
    batch.add_columns(0, 5, decoded)
    kept = [evs[0], evs[2], evs[3]]
    columns_equal(batch.columns(), Columns.from_events(kept, [(0, 5)] * 3))
    assert batch.events([0, 1, 2]) == kept
    assert capacity_of(batch) == capacity_rows(kept, [(0, 5)] * 3)
    assert batch.served() == _served(kept, series_index(kept)[0])


def _fields(ev: InferenceEvent) -> dict[str, Any]:
    return {f: getattr(ev, f) for f in ev.__struct_fields__}


def test_a_columnar_message_taken_apart_reads_as_its_valid_requests() -> None:
    """A message the typed decode refuses is judged request by request and comes
    without the screen's arrays: the batch reads its columns from the lists."""
    import json

    evs = [request(i, i) for i in range(4)]
    doc = json.loads(encode_columns(evs))
    doc["requests"]["e2e_ms"][2] = "slow"  # a wrong type: the typed decode refuses it
    decoded = decode_columns(json.dumps(doc).encode(), now_ms=NOW, limits=Limits())
    assert [r.index for r in decoded.rejects] == [2]
    assert decoded.numbers is None
    batch = RequestBatch()
    batch.add_rows(1, 3, [evs[3]])
    batch.add_columns(0, 4, decoded)
    kept = [evs[3], evs[0], evs[1], evs[3]]
    positions = [(1, 3), (0, 4), (0, 4), (0, 4)]
    columns_equal(batch.columns(), Columns.from_events(kept, positions))
