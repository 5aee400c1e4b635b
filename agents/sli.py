"""SLI agent: requests forwarded to their series' partition, and the folder's timers.

The ingest agent folds the requests whose series live on the partition they
came in on itself (one hop, :mod:`tailguard.agents.ingest`); the others reach
their series' partition through ``tailguard.internal.series`` (one message
per partition and batch, as columns grouped by series,
:mod:`tailguard.agents.internal`), and this agent folds them with the same
:class:`~tailguard.agents.folder.SeriesFolder`.

Its timers serve both paths: checkpoints of partitions whose input went quiet,
and *provisional* snapshots (``final: false``) of series that changed, every
``snapshot_interval_s`` of wall-clock time, within a time budget, so a quiet
series' open minute is visible too. Final snapshots depend only on the events,
so a replay publishes the same ones (same ``event_id``).
"""

import time
from typing import Any

import faust
from faust.types import TP
from tailguard.agents.folder import Read, SeriesFolder
from tailguard.agents.internal import decode_groups, partition_for
from tailguard.agents.settings import Settings
from tailguard.agents.sli_payload import final_cadence_ms, snapshot_payload
from tailguard.agents.topics import Topics
from tailguard.schemas.placement import series_of_key

__all__ = ["final_cadence_ms", "register_sli", "snapshot_payload"]

#: Share of each provisional-snapshot period the timer may spend publishing.
_PROVISIONAL_SHARE = 0.1
#: Windows summarised together (their percentiles in one pass) between budget checks.
_PROVISIONAL_CHUNK = 256


def register_sli(app: faust.App, topics: Topics, settings: Settings, folder: SeriesFolder) -> Any:
    """Attach the SLI agent, the folder's timers and its rebalance hooks."""
    internal_topic = topics.series.get_topic_name()
    store = folder.store
    stats = folder.stats

    @app.agent(topics.series, name="tailguard.sli")
    async def sli(stream: faust.StreamT[bytes]) -> None:
        manual = stream.noack()
        async for event in manual.events():
            async with folder.busy:
                partition = event.message.partition
                folder.hold(partition, manual, event)
                try:
                    groups = decode_groups(event.value)
                except ValueError as exc:
                    # Only this worker writes the topic: a bad record is a bug or a
                    # foreign producer. Skip it loudly rather than stop the partition.
                    app.log.error("tailguard: skipping undecodable internal record: %s", exc)
                    stats.internal_errors += 1
                    continue
                folder.note_forwarded(groups.series)
                await folder.fold(partition, groups.series, groups.cols, groups.bounds, groups.gpus)
                await folder.checkpoint_due([partition])

    @app.timer(settings.feeder_idle_s / 4, name="tailguard.sli.idle_feeders")
    async def forget_idle_feeders() -> None:
        await folder.forget_idle_feeders(time.monotonic())

    @app.timer(max(settings.checkpoint_interval_s / 2, 0.5), name="tailguard.sli.checkpoint")
    async def checkpoint_quiet_partitions() -> None:
        await folder.checkpoint_quiet_partitions()

    if settings.snapshot_interval_s > 0:

        @app.timer(settings.snapshot_interval_s, name="tailguard.sli.provisional")
        async def provisional() -> None:
            # Only once this rebalance's changelog restore is done: during a
            # rebalance ``recovery.completed`` may still be set from the previous
            # one, and warming then would cache stale local state (found by the
            # takeover test).
            if (
                store.needs_warm
                and not app.rebalancing
                and not getattr(app, "in_recovery", False)
                and app.tables.recovery.completed.is_set()
            ):
                loaded = store.warm(lambda key: partition_for(key, settings.partitions))
                app.log.info("tailguard: loaded %d series from the tables", loaded)
            # Within a time budget, oldest change first: with thousands of busy
            # series a full pass would starve the agents, and what is left waits
            # for the next tick.
            began = time.monotonic()
            budget = settings.snapshot_interval_s * _PROVISIONAL_SHARE
            while time.monotonic() - began <= budget:
                reads: list[Read] = []
                while len(reads) < _PROVISIONAL_CHUNK and (found := store.next_changed()):
                    key, cached = found
                    end = cached.state.default_end()
                    if end is None:
                        continue
                    series = folder.names.get(key) or series_of_key(key)
                    reads += folder.reads(series, cached.state, end, final=False)
                    cached.state.release_window_cache()  # the next provisional end differs
                if not reads:
                    break
                folder.send_all(folder.snapshots(reads, final=False))

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, revoked: set[TP], **kwargs: Any) -> None:
        folder.revoked({tp.partition for tp in revoked if tp.topic == internal_topic})

    @app.on_partitions_assigned.connect
    async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        folder.assigned({tp.partition for tp in assigned if tp.topic == internal_topic})

    return sli
