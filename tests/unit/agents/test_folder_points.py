"""A closed minute reaches the interference detector straight from the folder."""

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import msgspec
from tailguard.agents.breaches import BreachEngine
from tailguard.agents.folder import SeriesFolder
from tailguard.agents.interference_wire import POINTS_PER_MESSAGE, PointsMsg, decode_internal
from tailguard.agents.pipeline import default_slos
from tailguard.agents.settings import Settings
from tailguard.agents.stats import WorkerStats
from tailguard.streams import SeriesWindows

from tests.unit.streams.conftest import T0_MS as T0
from tests.unit.streams.conftest import Event as Ev

SERIES = ("chat", "m1", "control", "acme")


def _topic(name: str) -> Any:
    return SimpleNamespace(get_topic_name=lambda: name)


def folder() -> SeriesFolder:
    topics: Any = SimpleNamespace(
        sli=_topic("sli"), breaches=_topic("breaches"), interference=_topic("interference")
    )
    engine = BreachEngine(slos=default_slos(), state_table={}, gpu_table=None)
    return SeriesFolder(None, topics, Settings(), WorkerStats(), None, engine, None)  # type: ignore[arg-type]


def closed_minute() -> SeriesWindows:
    state = SeriesWindows()
    state.add([Ev(f"e{i}", T0 + i * 1000, ttft_ms=100.0 + i) for i in range(60)])
    return state


def test_a_final_one_minute_snapshot_comes_with_its_point_for_the_deployment() -> None:
    f, state = folder(), closed_minute()
    out = f.snapshots(f.reads(SERIES, state, T0 + 60_000, final=True), final=True)
    assert all(topic != "interference" for topic, *_ in out)  # gathered, sent per fold
    records = f.point_records()
    assert len(records) == 1 and not f.points
    key, value = records[0]
    batch = decode_internal(value)
    assert key == b"chat|m1" and isinstance(batch, PointsMsg)
    assert len(batch.points) == 1  # the 1m window only, not 5m or 1h
    msg = batch.points[0]
    snapshot = next(
        msgspec.json.decode(value)
        for topic, _, value, _ in out
        if topic == "sli" and msgspec.json.decode(value)["window"] == "1m"
    )
    assert (msg.variant, msg.tenant) == ("control", "acme")
    assert msg.point.end_ms == snapshot["window_end_ms"] == T0 + 60_000
    assert msg.point.count == snapshot["count"] == 60
    assert msg.point.ttft_p99 == snapshot["ttft_ms"]["p99"]
    assert msg.point.ttft_n == snapshot["ttft_ms"]["count"]
    assert msg.point.compliance == snapshot["slo_compliance"]
    assert msg.exemplars == snapshot["exemplars"][:5]


def test_provisional_snapshots_send_no_point() -> None:
    f, state = folder(), closed_minute()
    out = f.snapshots(f.reads(SERIES, state, T0 + 60_000, final=False), final=False)
    assert [topic for topic, *_ in out if topic == "interference"] == []
    assert any(topic == "sli" for topic, *_ in out)


def test_after_a_batch_the_most_overdue_partition_is_checkpointed_and_the_others_next() -> None:
    f = folder()
    done: list[list[int]] = []

    async def checkpoint(partitions: list[int], **_: object) -> None:
        done.append(list(partitions))
        for partition in partitions:
            f.cadence.done(partition, time.monotonic(), time.monotonic())

    f.checkpoint = checkpoint  # type: ignore[method-assign]
    now = time.monotonic()
    for partition, last in ((0, now - 100), (1, now), (2, now - 200)):
        f.cadence.done(partition, last, last)
    asyncio.run(f.checkpoint_due([0, 1, 2]))
    assert done == [[2]], "one partition a cut, the one due longest"
    asyncio.run(f.checkpoint_due([0, 1, 2]))
    asyncio.run(f.checkpoint_due([0, 1, 2]))
    assert done == [[2], [0]], "then the other due; none while none is"


def test_the_points_of_a_fold_go_as_one_record_per_deployment_in_the_order_they_closed() -> None:
    f = folder()
    tenants = [f"t{i}" for i in range(POINTS_PER_MESSAGE + 2)]
    for tenant in tenants:
        series = ("chat", "m1", "control", tenant)
        f.snapshots(f.reads(series, closed_minute(), T0 + 60_000, final=True), final=True)
    other = ("search", "m2", "control", "acme")
    f.snapshots(f.reads(other, closed_minute(), T0 + 60_000, final=True), final=True)
    records = [(key, decode_internal(value)) for key, value in f.point_records()]
    assert [key for key, _ in records] == [b"chat|m1", b"chat|m1", b"search|m2"]
    sizes = [len(msg.points) for _, msg in records]  # type: ignore[union-attr]
    assert sizes == [POINTS_PER_MESSAGE, 2, 1]
    sent = [p.tenant for _, msg in records[:2] for p in msg.points]  # type: ignore[union-attr]
    assert sent == tenants
    assert f.point_records() == []


class _Sent:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, dict[str, Any]]] = []

    def send(self, topic: str, key: bytes, value: bytes, headers: Any = None) -> None:
        doc = msgspec.json.decode(value) if topic != "interference" else {"raw": value}
        doc.pop("ts_ms", None)  # the wall clock of the close
        self.records.append((topic, key, doc))


def _close_all(chunk: int, values: int, monkeypatch: Any) -> tuple[list[Any], list[int]]:
    """Close the minute of 30 series through ``close_all`` with chunks of at most
    ``chunk`` closes and ``values`` values: what is sent, and how many records
    were sent as each chunk began."""
    import tailguard.agents.folder as folder_module
    from tailguard.agents.state import CachedSeries

    monkeypatch.setattr(folder_module, "_CLOSE_CHUNK", chunk)
    monkeypatch.setattr(folder_module, "_CHUNK_VALUES", values)
    f = folder()
    f.outputs = _Sent()  # type: ignore[assignment]
    chunks: list[int] = []
    summarise = f.snapshots

    def counted(*args: Any, **kw: Any) -> Any:
        chunks.append(len(f.outputs.records))  # type: ignore[attr-defined]
        return summarise(*args, **kw)

    f.snapshots = counted  # type: ignore[method-assign]
    closes = []
    for i in range(30):
        series = ("chat", "m1", "control", f"t{i}")
        cached = CachedSeries(closed_minute(), 0)
        closes.append((series, "|".join(series), cached, f.engine.specs_for(series), T0 + 60_000))
    f.close_all(closes)
    return f.outputs.records, chunks  # type: ignore[attr-defined]


def test_a_close_publishes_the_same_however_its_closes_are_chunked(monkeypatch: Any) -> None:
    whole, one_chunk = _close_all(1024, 8_000_000, monkeypatch)
    by_count, chunks_of_7 = _close_all(7, 8_000_000, monkeypatch)
    by_values, chunks_of_1 = _close_all(1024, 1, monkeypatch)  # a close's windows hold more

    assert (len(one_chunk), len(chunks_of_7), len(chunks_of_1)) == (1, 5, 30)
    # Final 1m and 5m snapshots a series (the 1h window's are due every 5 minutes),
    # and one record of points.
    assert len(whole) == 30 * 2 + 1
    assert by_count == whole and by_values == whole


def test_each_chunk_of_a_close_is_published_before_the_next_is_closed(monkeypatch: Any) -> None:
    records, sent_at_start = _close_all(7, 8_000_000, monkeypatch)
    # Two final snapshots a series: chunks of 7, 7, 7, 7 and 2 series.
    assert sent_at_start == [0, 14, 28, 42, 56]
    assert len(records) == 30 * 2 + 1  # the points last, once
    assert records[-1][0] == "interference"
