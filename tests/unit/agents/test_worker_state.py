"""Worker settings, the crash-safe data dir and the series store."""

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from tailguard.agents.errors import SettingsError
from tailguard.agents.settings import Settings
from tailguard.agents.state import CheckpointInterrupted, SeriesStore, bucket_key
from tailguard.agents.worker import CLEAN_MARKER, prepare_data_dir
from tailguard.streams import RingConfig


def test_a_clean_stop_keeps_local_state(tmp_path: Path) -> None:
    data = tmp_path / "w"
    data.mkdir()
    (data / "table.sst").write_text("x")
    (data / CLEAN_MARKER).touch()
    assert prepare_data_dir(data) is False
    assert (data / "table.sst").exists()
    assert not (data / CLEAN_MARKER).exists(), "the marker is consumed by the start"


def test_a_start_after_a_crash_discards_local_state(tmp_path: Path) -> None:
    data = tmp_path / "w"
    data.mkdir()
    (data / "table.sst").write_text("x")
    assert prepare_data_dir(data) is True
    assert data.exists() and not (data / "table.sst").exists()


def test_a_first_start_creates_the_data_dir(tmp_path: Path) -> None:
    assert prepare_data_dir(tmp_path / "new") is False
    assert (tmp_path / "new").is_dir()


def test_settings_name_what_is_wrong() -> None:
    with pytest.raises(SettingsError, match="unknown SLI window"):
        Settings(sli_windows=("2m",))
    with pytest.raises(SettingsError, match="partitions"):
        Settings(partitions=0)


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAILGUARD_BROKER", "k:1")
    monkeypatch.setenv("TAILGUARD_TOPIC_PREFIX", "ns.")
    s = Settings.from_env(partitions=3)
    assert (s.broker, s.topic_prefix, s.partitions) == ("k:1", "ns.", 3)
    opts = s.rocksdb_options()
    assert opts["driver"] == "rocksdict"
    assert opts["block_cache_size"] == 16 * 1024 * 1024


class _Ev:
    def __init__(self, i: int) -> None:
        self.event_id = f"e{i}"
        self.ts_ms = 1_700_000_000_000 + i * 30_000
        self.status = "ok"
        self.e2e_ms = 500.0
        self.ttft_ms = 100.0
        self.output_tokens = 5
        self.itl_ms = [20.0, 20.0, 20.0, 20.0]
        self.trace_id = None
        self.warmup = False


def test_the_store_writes_only_touched_buckets_and_restores_them() -> None:
    meta: dict[str, bytes] = {}
    buckets: dict[str, bytes] = {}
    store = SeriesStore(meta, buckets, RingConfig())
    cached = store.get("s", partition=0)
    cached.state.add([_Ev(i) for i in range(4)], [(0, i) for i in range(4)])
    store.save("s", cached.state.take_changes())
    assert set(meta) == {"s"}
    assert len(buckets) == 2  # four events at 30 s spacing span two minutes
    assert all(k.startswith("s\x1fm\x1f") for k in buckets)
    fresh = SeriesStore(meta, buckets, RingConfig())
    again = fresh.get("s", partition=0)
    assert again.state.counters(60_000 * 5) == cached.state.counters(60_000 * 5)
    assert bucket_key("s", "m", 1) == "s\x1fm\x1f1"
    assert fresh.forget_partitions({0}) == 1 and len(fresh) == 0


def test_malloc_arenas_are_capped_unless_the_environment_decides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tailguard.agents import worker

    calls: list[tuple[int, int]] = []

    class Libc:
        def mallopt(self, param: int, value: int) -> int:
            calls.append((param, value))
            return 1

    monkeypatch.setattr(worker.ctypes, "CDLL", lambda _name: Libc())
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert worker.limit_malloc_arenas(2) and calls == [(-8, 2)]
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert not worker.limit_malloc_arenas(2) and len(calls) == 1


class _Journal(dict[str, bytes]):
    """A table that notes every write and delete, in order, in a shared journal."""

    def __init__(self, name: str, journal: list[tuple[str, str]]) -> None:
        super().__init__()
        self.name, self.journal = name, journal

    def __setitem__(self, key: str, value: bytes) -> None:
        self.journal.append((f"{self.name} write", key))
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.journal.append((f"{self.name} delete", key))
        super().__delitem__(key)


def test_a_checkpoint_flushes_between_buckets_metas_and_deletes() -> None:
    """Buckets, flush, metas, flush, deletes: a meta on the changelog never lists a
    bucket version that is not there, and is never restored after a bucket it
    lists was deleted (the property tests in test_ring_properties.py show why)."""
    journal: list[tuple[str, str]] = []
    small = RingConfig(
        bucket_ms=1_000, rollup_ms=10_000, fine_retention_ms=20_000, allowed_lateness_ms=2_000
    )
    store = SeriesStore(_Journal("meta", journal), _Journal("buckets", journal), small)

    async def flush() -> None:
        journal.append(("flush", ""))

    def checkpoint() -> list[str]:
        journal.clear()
        asyncio.run(store.checkpoint(0, flush))
        return [what for what, _ in journal]

    for name in ("a", "b"):
        store.get(name, partition=0).state.add([_Ev(0)], [(0, 0)])
        store.mark_unsaved(name, 0)
    steps = checkpoint()
    assert steps == ["buckets write"] * 2 + ["flush"] + ["meta write"] * 2
    assert checkpoint() == [], "nothing changed: nothing written, nothing flushed"

    # 40 s later (events are 30 s apart): minutes closed, an hour rolled up, the
    # first minute pruned.
    late = _Ev(0)
    late.ts_ms += 40_000
    store.get("a", partition=0).state.add([late], [(0, 1)])
    store.mark_unsaved("a", 0)
    steps = checkpoint()
    first_flush = steps.index("flush")
    assert set(steps[:first_flush]) == {"buckets write"}
    assert steps[first_flush:] == ["flush", "meta write", "flush", "buckets delete"]
    assert journal[-1] == ("buckets delete", bucket_key("a", "m", _Ev(0).ts_ms))


def test_a_checkpoint_stops_when_its_partition_moved_during_a_flush() -> None:
    """A rebalance while a checkpoint waits: nothing more is written (its next owner
    may have read the changelog already), and if the partition stays, the next
    checkpoint writes the series whole."""
    journal: list[tuple[str, str]] = []
    store = SeriesStore(_Journal("meta", journal), _Journal("buckets", journal), RingConfig())
    cached = store.get("s", partition=0)
    cached.state.add([_Ev(i) for i in range(4)], [(0, i) for i in range(4)])  # two minutes
    store.mark_unsaved("s", 0)
    mine = [True]

    async def flush() -> None:
        journal.append(("flush", ""))
        mine[0] = False  # revoked meanwhile

    with pytest.raises(CheckpointInterrupted, match="partition 0 moved"):
        asyncio.run(store.checkpoint(0, flush, lambda: mine[0]))
    assert [what for what, _ in journal] == ["buckets write"] * 2 + ["flush"]

    # Assigned back: the next checkpoint writes both buckets again, then the meta.
    again = _Ev(4)
    again.ts_ms -= 30_000  # in the second minute: touches that one only
    cached.state.add([again], [(0, 4)])
    mine[0] = True
    journal.clear()

    async def plain_flush() -> None:
        journal.append(("flush", ""))

    asyncio.run(store.checkpoint(0, plain_flush, lambda: mine[0]))
    assert [what for what, _ in journal] == ["buckets write"] * 2 + ["flush", "meta write"]


def test_partitions_checkpointed_together_share_each_flush_and_one_that_moves_stops_alone() -> None:
    """Every step covers every partition: three round trips for any number of
    partitions. A partition revoked during a flush is written no further; the
    others go on, and the one that moved is written whole if it stays."""
    journal: list[tuple[str, str]] = []
    store = SeriesStore(_Journal("meta", journal), _Journal("buckets", journal), RingConfig())
    for name, partition in (("a", 0), ("b", 1), ("c", 2)):
        store.get(name, partition=partition).state.add([_Ev(0)], [(partition, 0)])
        store.mark_unsaved(name, partition)
    mine = {0: True, 1: True, 2: True}

    async def flush() -> None:
        journal.append(("flush", ""))
        mine[1] = False  # revoked meanwhile

    done = asyncio.run(store.checkpoint_many([0, 1, 2], flush, lambda p: mine[p]))
    assert [what for what, _ in journal] == ["buckets write"] * 3 + ["flush"] + ["meta write"] * 2
    assert [key for what, key in journal if what == "meta write"] == ["a", "c"]
    assert done.moved == {1} and not done.refused
    assert [p for p in (0, 1, 2) if done.stored(p)] == [0, 2]
    assert done.written == {0: 2, 2: 2}

    mine[1] = True
    journal.clear()
    again = asyncio.run(store.checkpoint_many([0, 1, 2], flush_plain(journal)))
    assert [key for what, key in journal if what == "meta write"] == ["b"], (
        "only the interrupted partition had anything left to write"
    )
    assert again.written == {1: 2}


def flush_plain(journal: list[tuple[str, str]]) -> Any:
    async def flush() -> None:
        journal.append(("flush", ""))

    return flush


def test_a_refused_flush_stops_every_partition_of_the_step() -> None:
    from tailguard.agents.outputs import OutputError

    journal: list[tuple[str, str]] = []
    store = SeriesStore(_Journal("meta", journal), _Journal("buckets", journal), RingConfig())
    for name, partition in (("a", 0), ("b", 1)):
        store.get(name, partition=partition).state.add([_Ev(0)], [(partition, 0)])
        store.mark_unsaved(name, partition)

    async def refused() -> None:
        raise OutputError("2 output records undelivered")

    done = asyncio.run(store.checkpoint_many([0, 1], refused))
    assert [what for what, _ in journal] == ["buckets write"] * 2, "no meta after a refusal"
    assert set(done.refused) == {0, 1} and not done.written
    journal.clear()
    asyncio.run(store.checkpoint_many([0, 1], flush_plain(journal)))
    assert [key for what, key in journal if what == "meta write"] == ["a", "b"]


def test_worker_tables_run_no_key_expiry_task() -> None:
    """faust's ``_clean_data`` task serves windowed tables only; left pending after
    heavy use it kept a table's stop waiting forever (the worker never stopped)."""
    import faust
    from tailguard.agents.app import PlainTable, make_app

    app = make_app(Settings(web_enabled=False))
    table = app.Table("t", default=None)
    assert isinstance(table, PlainTable)
    assert [t.fun.__name__ for t in faust.Table._get_tasks(table)] == ["_clean_data"]
    assert list(table._get_tasks()) == []


def _faust_wait(logger: logging.Logger, size: int, took: float) -> None:
    # What faust's ProducerBuffer.wait_until_ebb logs for each wait.
    logger.warning(f"producer buffer full size {size}")
    logger.info(f"producer flush took {took}")


def test_faust_back_pressure_lines_become_one_summary_a_minute(caplog) -> None:
    from tailguard.agents.worker import ProducerBackpressureSummary

    now = [0.0]
    logger = logging.getLogger("faust.transport.producer.test")
    summary = ProducerBackpressureSummary(every_s=60.0, clock=lambda: now[0])
    logger.addFilter(summary)
    try:
        with caplog.at_level(logging.INFO, logger=logger.name):
            _faust_wait(logger, 201, 0.01)  # the first wait is reported at once
            for _ in range(500):
                now[0] += 0.1
                _faust_wait(logger, 150, 0.02)
            now[0] = 70.0
            _faust_wait(logger, 180, 0.5)
            logger.info("an unrelated line")
    finally:
        logger.removeFilter(summary)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith(
        "tailguard: table writes waited for faust's changelog producer 1 time(s) in the last 0 s"
    )
    assert lines[0].endswith(
        "(producer buffer full size 201; back-pressure: normal in "
        "bursts, a stalled producer if it persists)"
    )
    # 500 waits in the minute, then one more: 501, with the waits' total time so far.
    assert (
        " 501 time(s) in the last 70 s, 10.01 s in all (producer buffer full size 180;"
        in (lines[1])
    )
    # Kept at faust's level: an operator running at WARNING still sees back-pressure.
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.WARNING, logging.INFO]
    assert lines[2] == "an unrelated line"


def test_provisional_snapshots_visit_only_changed_series_oldest_change_first() -> None:
    store = SeriesStore({}, {}, RingConfig())
    for name in ("a", "b", "c"):
        store.get(name, partition=0)
    store.mark_unsaved("b", 0)
    store.mark_unsaved("a", 0)
    store.mark_unsaved("b", 0)  # changed again before it was shown: keeps its place
    shown = []
    while (found := store.next_changed()) is not None:
        shown.append(found[0])
    assert shown == ["b", "a"], "c never changed"
    store.forget_partitions({0})
    store.mark_unsaved("a", 0)
    assert store.next_changed() is None, "a series no longer held here is skipped"


def test_a_checkpoint_the_broker_refused_is_written_whole_next_time() -> None:
    from tailguard.agents.outputs import OutputError

    journal: list[tuple[str, str]] = []
    store = SeriesStore(_Journal("meta", journal), _Journal("buckets", journal), RingConfig())
    store.get("s", partition=0).state.add([_Ev(i) for i in range(4)], [(0, i) for i in range(4)])
    store.mark_unsaved("s", 0)

    async def refused() -> None:
        raise OutputError("1 output records undelivered")

    with pytest.raises(CheckpointInterrupted, match="not delivered"):
        asyncio.run(store.checkpoint(0, refused))
    assert [what for what, _ in journal] == ["buckets write"] * 2
    journal.clear()

    async def fine() -> None:
        journal.append(("flush", ""))

    asyncio.run(store.checkpoint(0, fine))
    assert [what for what, _ in journal] == ["buckets write"] * 2 + ["flush", "meta write"]


def test_stopping_hooks_run_before_the_consumer_stops_and_a_failing_one_does_not_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import faust
    from tailguard.agents.app import make_app

    app = make_app(Settings(web_enabled=False))
    order: list[str] = []

    async def consumer_stops(self: object) -> None:
        order.append("faust stops the consumer")

    async def broken() -> None:
        order.append("broken hook")
        raise RuntimeError("broker away")

    async def store_held() -> None:
        order.append("store what is held")

    monkeypatch.setattr(faust.App, "on_stop", consumer_stops)
    app.stopping_hooks += [broken, store_held]  # type: ignore[attr-defined]
    asyncio.run(app.on_stop())
    assert order == ["broken hook", "store what is held", "faust stops the consumer"]


def test_a_series_remembers_the_gpus_that_served_it_last() -> None:
    from tailguard.agents.state import MAX_GPUS_PER_SERIES, CachedSeries
    from tailguard.streams import SeriesWindows

    cached = CachedSeries(SeriesWindows(), 0)
    cached.note_gpus([("h1", g, 1_000 + g) for g in range(MAX_GPUS_PER_SERIES + 6)])
    cached.note_gpus([("h1", 0, 5_000), ("h1", 1, 10)])  # GPU 0 seen again; GPU 1's is older

    assert len(cached.gpus) == MAX_GPUS_PER_SERIES
    assert cached.gpus[("h1", 0)] == 5_000
    # The oldest two went: GPU 1 (its sample is older than any kept) and GPU 6.
    assert ("h1", 1) not in cached.gpus and ("h1", 6) not in cached.gpus
    assert min(ts for (_, g), ts in cached.gpus.items() if g) == 1_007
