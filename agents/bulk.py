"""Many keys of one faust table written at once: RocksDB without its log, changelog in bulk.

faust's ``Table.__setitem__`` costs ≥ 12 µs a key before aiokafka does
anything (the store, the changelog future, the per-key bookkeeping); a
checkpoint of 10,000 busy series writes ~30,000 keys. :class:`BulkWriter`
does per partition what faust's recovery does in reverse
(``faust.stores.rocksdb.Store.apply_changelog_batch``):

1. every put and delete goes to the partition's database without its write-ahead
   log (see below);
2. every key becomes a changelog record of the table's changelog topic, on the
   same partition, in the format faust restores from (raw key and value bytes;
   a delete is a tombstone), queued in librdkafka (``Outputs``, about a
   microsecond a record);
3. once the caller's flush has them delivered, :meth:`BulkWriter.delivered`
   records the newest offset per partition as the store's *persisted offset*,
   as faust does for its own writes, so a restart reads only newer records.

The caller flushes (:meth:`~tailguard.agents.outputs.Outputs.flush`) before it
acknowledges the input the records hold: the changelog is delivered before
the offsets commit, as the recovery design needs. Tables on another store
(``memory://`` in some tests) are written key by key through faust.

No write-ahead log: the changelog is what restores a table. A worker trusts its
data dir only after a clean stop (:func:`~tailguard.agents.worker.prepare_data_dir`
discards it otherwise, and faust restores the tables from their changelogs),
and a clean stop flushes what was written to disk (:meth:`BulkWriter.persist`).
The RocksDB log would only write every byte twice, holding the interpreter
for it: writing 10,000 buckets of 6.4 KB took 0.30 s through a write batch
with the log, 0.05 s key by key without it (2 cores, in process). The
persisted offset is written the same way, so a database that loses its
unflushed writes loses them with the offset that counts them, and faust
reads them again from the changelog.
"""

from collections.abc import Sequence
from typing import Any

from rocksdict import WriteOptions
from tailguard.agents.outputs import Outputs

__all__ = ["BulkWriter", "read_partition", "write_by_key"]

Key = str | bytes

_NO_LOG = WriteOptions()
_NO_LOG.disable_wal = True


def write_by_key(table: Any, puts: Sequence[tuple[Key, bytes]], deletes: Sequence[Key]) -> int:
    """The same writes through the mapping interface (faust's per-key path, or a dict)."""
    for key, value in puts:
        table[key] = value
    for key in deletes:
        if key in table:
            del table[key]
    return len(puts) + len(deletes)


def _bulk_capable(table: Any) -> bool:
    return hasattr(getattr(table, "data", None), "_db_for_partition")


def _raw(key: Key) -> bytes:
    return key.encode() if isinstance(key, str) else key


def read_partition(table: Any, partition: int, key: Key) -> bytes | None:
    """The value of ``key`` in ``table``'s ``partition``, read from its database
    directly (faust's ``Table.get`` costs several µs more a key, and reads the
    partition of whatever event is current); other tables through their mapping."""
    if not _bulk_capable(table):
        value: bytes | None = table.get(key)
        return value
    found: bytes | None = table.data._db_for_partition(partition).get(_raw(key))
    return found


class BulkWriter:
    """Writes a batch of keys of a faust table on one partition (see the module)."""

    def __init__(self, outputs: Outputs) -> None:
        self._outputs = outputs
        #: (table, changelog partition) → newest offset queued and not yet recorded.
        self._pending: dict[tuple[Any, int], list[int]] = {}
        #: Tables written through this writer (their databases are flushed at a stop).
        self._tables: set[Any] = set()

    @staticmethod
    def can_write(table: Any) -> bool:
        """Whether :meth:`write` writes ``table`` in bulk, on the partition it is given
        (a table on another store is written key by key, on the current event's)."""
        return _bulk_capable(table)

    def write(
        self,
        table: Any,
        partition: int,
        puts: Sequence[tuple[Key, bytes]],
        deletes: Sequence[Key] = (),
    ) -> int:
        """Apply ``puts`` and ``deletes`` to ``table``'s ``partition``; returns the keys written.

        Table keys are strings (UTF-8 on disk and on the changelog, as faust's raw
        codec writes them) or bytes (written as they are)."""
        if not puts and not deletes:
            return 0
        if not _bulk_capable(table):
            return write_by_key(table, puts, deletes)
        db = table.data._db_for_partition(partition)
        records: list[tuple[bytes, bytes | None]] = []
        for key, value in puts:
            raw = _raw(key)
            db.put(raw, value, write_opt=_NO_LOG)
            records.append((raw, value))
        for key in deletes:
            raw = _raw(key)
            db.delete(raw, write_opt=_NO_LOG)
            records.append((raw, None))
        topic = table.changelog_topic.get_topic_name()
        newest = self._pending.setdefault((table, partition), [-1])
        self._outputs.send_records(topic, partition, records, newest)
        self._tables.add(table)
        return len(records)

    def delivered(self) -> None:
        """After a successful flush: remember the newest changelog offset of each
        partition written as the store's persisted offset."""
        for (table, partition), newest in self._pending.items():
            # A partition revoked meanwhile has its database closed: its next
            # owner restores from the changelog, whatever is recorded here.
            store = table.data
            if newest[0] >= 0 and partition in getattr(store, "_dbs", {}):
                # As faust's ``set_persisted_offset`` writes it, without the log.
                db = store._db_for_partition(partition)
                db.put(store.offset_key, str(newest[0]).encode(), write_opt=_NO_LOG)
        self._pending.clear()

    def persist(self) -> None:
        """Flush to disk what was written to every partition's database still open
        (at a clean stop: the data dir is then trusted at the next start)."""
        for table in self._tables:
            for db in list(getattr(table.data, "_dbs", {}).values()):
                db.flush(wait=True)
