"""The faust application object, configured from :class:`Settings`."""

from collections.abc import Mapping
from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, Message
from tailguard.agents.settings import Settings

__all__ = ["SeekingConsumer", "make_app"]


class SeekingConsumer(faust_aiokafka.Consumer):
    """faust's aiokafka consumer that reads again what a rebalance skipped.

    Around a rebalance faust skips the messages it fetched while flow was
    suspended or under the old generation and acknowledges them, then seeks
    each partition back to its committed offset so they are read again. Two
    holes, both closed here:

    - The acknowledgement of a skipped message counts towards the commit: if
      the commit moves past it before its second copy has been processed and
      checkpointed, a crash loses it. A skipped message never reached a
      stream, and faust tracks a message only once a stream takes it, so
      :meth:`ack` ignores untracked messages.
    - aiokafka's ``seek_to_committed`` leaves a partition alone when its
      committed offset is missing or 0 (``if offset and offset > 0``), so on
      a partition nothing has been committed for yet the skipped messages
      were never read again. :meth:`seek_to_committed` seeks those
      partitions itself: to 0 when 0 is committed, to the beginning
      (``auto_offset_reset=earliest``) when nothing is. Only acknowledged
      input topics are touched; changelog partitions belong to table
      recovery.
    """

    def ack(self, message: Message) -> bool:
        if not message.tracked:
            return False
        return super().ack(message)

    async def seek_to_committed(self) -> Mapping[TP, int]:
        committed: Mapping[Any, Any] = await super().seek_to_committed()
        acking = self.app.topics.acks_enabled_for
        never = [tp for tp, offset in committed.items() if offset is None and acking(tp.topic)]
        if never:
            await self._thread.seek_to_beginning(*never)
        for tp, offset in committed.items():
            if offset == 0 and acking(tp.topic):
                await self.seek(tp, 0)
        return committed


class Transport(faust_aiokafka.Transport):
    """faust's aiokafka transport, building :class:`SeekingConsumer`."""

    Consumer = SeekingConsumer


class App(faust.App):
    """faust.App on :class:`Transport` (``kafka://`` brokers only)."""

    def _new_transport(self) -> Any:
        return Transport(self.conf.broker_consumer, self)


def make_app(settings: Settings) -> faust.App:
    """A faust app with RocksDB (rocksdict) tables and raw-bytes topics.

    Payload codecs are tailguard's own (msgspec), so faust moves bytes only.
    """
    return App(
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
        web_bind=settings.web_bind,
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
