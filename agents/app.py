"""The faust application object, configured from :class:`Settings`."""

import faust
from tailguard.agents.settings import Settings

__all__ = ["make_app"]


def make_app(settings: Settings) -> faust.App:
    """A faust app with RocksDB (rocksdict) tables and raw-bytes topics.

    Payload codecs are tailguard's own (msgspec), so faust moves bytes only.
    """
    return faust.App(
        settings.app_id,
        broker=f"kafka://{settings.broker}",
        store="rocksdb://",
        datadir=str(settings.data_dir),
        topic_partitions=settings.partitions,
        topic_replication_factor=1,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=settings.web_enabled,
        web_port=settings.web_port,
        web_bind="127.0.0.1",
        producer_acks=-1,
        producer_linger_ms=5,
        producer_max_request_size=8 * 1024 * 1024,
        consumer_max_fetch_size=8 * 1024 * 1024,
        consumer_auto_offset_reset="earliest",
        broker_commit_every=2_000,
        broker_commit_interval=1.0,
        stream_buffer_maxsize=8_192,
        # The SLI agent holds its input unacknowledged until a checkpoint has
        # stored what it folded in; waiting for those acks at a rebalance or
        # shutdown would wait forever. Unacknowledged input is simply consumed
        # again by whoever owns the partition next (idempotent per bucket).
        stream_wait_empty=False,
        table_standby_replicas=0,
        # RocksDB is the source of truth on disk; faust's in-memory key index
        # only needs to remember which partition a key lives in.
        table_key_index_size=100_000,
        logging_config=None,
    )
