"""BulkWriter: RocksDB writes without the log, changelog records faust can restore from."""

from __future__ import annotations

from pathlib import Path

from faust.stores.rocksdb import Store as FaustStore
from rocksdict import Options, Rdict
from tailguard.agents.bulk import BulkWriter, read_partition


class FakeOutputs:
    """Delivers every record at once, numbering offsets per partition like a broker."""

    def __init__(self) -> None:
        self.records: list[tuple[str, int, bytes, bytes | None]] = []
        self._next: dict[tuple[str, int], int] = {}

    def send_records(
        self,
        topic: str,
        partition: int,
        records: list[tuple[bytes, bytes | None]],
        newest: list[int],
    ) -> None:
        for key, value in records:
            offset = self._next.get((topic, partition), 0)
            self._next[(topic, partition)] = offset + 1
            self.records.append((topic, partition, key, value))
            newest[0] = max(newest[0], offset)


class Topic:
    def get_topic_name(self) -> str:
        return "app-tailguard-buckets-changelog"


class Store:
    """The part of faust's RocksDB store the writer uses, over real RocksDB."""

    offset_key = FaustStore.offset_key

    def __init__(self, root: Path) -> None:
        self.root = root
        self._dbs: dict[int, Rdict] = {}

    def _db_for_partition(self, partition: int) -> Rdict:
        if partition not in self._dbs:
            self._dbs[partition] = Rdict(str(self.root / f"p{partition}"), Options(raw_mode=True))
        return self._dbs[partition]

    @property
    def persisted(self) -> dict[int, int]:
        """The persisted offset of each open partition, read as faust reads it."""
        out = {}
        for partition, db in self._dbs.items():
            raw = db.get(self.offset_key)
            if raw is not None:
                out[partition] = int(raw)
        return out


class Table:
    def __init__(self, root: Path) -> None:
        self.data = Store(root)
        self.changelog_topic = Topic()


def contents(db: Rdict) -> dict[bytes, bytes]:
    return {bytes(k): bytes(v) for k, v in db.items()}


def test_puts_and_deletes_land_in_the_partition_and_on_its_changelog(tmp_path: Path) -> None:
    table = Table(tmp_path)
    outputs = FakeOutputs()
    writer = BulkWriter(outputs)  # type: ignore[arg-type]
    assert writer.write(table, 1, [("a", b"1"), ("b", b"2"), ("c", b"3")]) == 3
    assert writer.write(table, 1, [("a", b"10")], ["b"]) == 2
    assert contents(table.data._db_for_partition(1)) == {b"a": b"10", b"c": b"3"}
    assert 0 not in table.data._dbs, "nothing written to another partition"
    topic = table.changelog_topic.get_topic_name()
    assert outputs.records == [
        (topic, 1, b"a", b"1"),
        (topic, 1, b"b", b"2"),
        (topic, 1, b"c", b"3"),
        (topic, 1, b"a", b"10"),
        (topic, 1, b"b", None),
    ]
    assert table.data.persisted == {}, "nothing is persisted before delivery is confirmed"
    writer.delivered()
    assert table.data.persisted == {1: 4}
    assert contents(table.data._db_for_partition(1)).keys() == {b"a", b"c", Store.offset_key}


def test_the_changelog_restores_what_the_writes_left(tmp_path: Path) -> None:
    table = Table(tmp_path / "live")
    outputs = FakeOutputs()
    writer = BulkWriter(outputs)  # type: ignore[arg-type]
    writer.write(table, 0, [(f"k{i}", f"v{i}".encode()) for i in range(50)])
    writer.write(
        table, 0, [(f"k{i}", b"new") for i in range(0, 50, 3)], [f"k{i}" for i in range(1, 50, 7)]
    )
    # What faust's recovery does with the changelog: apply the records in order.
    restored = Rdict(str(tmp_path / "restored"), Options(raw_mode=True))
    for _, _, key, value in outputs.records:
        if value is None:
            del restored[key]
        else:
            restored[key] = value
    assert contents(restored) == contents(table.data._db_for_partition(0))


def test_a_revoked_partition_gets_no_persisted_offset(tmp_path: Path) -> None:
    table = Table(tmp_path)
    writer = BulkWriter(FakeOutputs())  # type: ignore[arg-type]
    writer.write(table, 2, [("a", b"1")])
    table.data._dbs.pop(2).close()  # faust closes a revoked partition's database
    writer.delivered()
    assert table.data.persisted == {}


def test_persist_puts_what_was_written_on_disk_for_the_next_start(tmp_path: Path) -> None:
    """Written without RocksDB's log, the writes and the persisted offset are in
    memory until flushed: a clean stop flushes them, and a reopened database
    holds them (a crash instead discards the data dir, see prepare_data_dir)."""
    table = Table(tmp_path)
    writer = BulkWriter(FakeOutputs())  # type: ignore[arg-type]
    writer.write(table, 0, [(f"k{i}", b"v" * 100) for i in range(100)])
    writer.delivered()
    db = table.data._db_for_partition(0)
    assert db.live_files() == [], "nothing on disk yet"
    writer.persist()
    assert db.live_files(), "flushed to a table file"
    before = contents(db)
    db.close()
    reopened = Rdict(str(tmp_path / "p0"), Options(raw_mode=True))
    assert contents(reopened) == before and int(reopened[Store.offset_key]) == 99
    reopened.close()


def test_a_mapping_without_a_rocksdb_store_is_written_key_by_key() -> None:
    table: dict[str, bytes] = {"gone": b"x"}
    outputs = FakeOutputs()
    writer = BulkWriter(outputs)  # type: ignore[arg-type]
    assert writer.write(table, 0, [("a", b"1")], ["gone", "never"]) == 3
    assert table == {"a": b"1"} and outputs.records == []


def test_bytes_keys_are_written_as_they_are_and_read_back_from_their_partition(
    tmp_path: Path,
) -> None:
    table = Table(tmp_path)
    outputs = FakeOutputs()
    writer = BulkWriter(outputs)  # type: ignore[arg-type]
    key = b"svc|m|v|t\x1fsilent"
    writer.write(table, 3, [(key, b"state"), ("text", b"t")])
    assert contents(table.data._db_for_partition(3)) == {key: b"state", b"text": b"t"}
    assert [r[2] for r in outputs.records] == [key, b"text"]
    assert read_partition(table, 3, key) == b"state"
    assert read_partition(table, 3, "text") == b"t"
    assert read_partition(table, 2, key) is None, "another partition's database is not read"
    assert read_partition({key: b"m"}, 0, key) == b"m", "a mapping is read through .get"
