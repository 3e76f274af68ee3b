"""A Faust transport whose consumer seeks to offsets stored in PostgreSQL.

Faust re-seeks every assigned partition to the *broker-committed* offset after each rebalance
(`Consumer.perform_seek()` → `seek_to_committed()`), so a seek done in a rebalance callback is
overwritten. The one reliable place is `seek_to_committed()` itself: we override it to seek the
partitions of our managed topics to the `next_offset` stored in Postgres (written in the same
transaction as the claims), and let Faust handle any other partition as usual.

The transport is registered under the URL scheme `pgkafka://`; the app supplies the store
through `app.offset_source` (see streams/app.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, ClassVar

from faust.transport.drivers import TRANSPORTS
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaFaustConsumer
from faust.transport.drivers.aiokafka import Transport as AIOKafkaTransport
from faust.types import TP

log = logging.getLogger("flashsend.offsets")

SCHEME = "pgkafka"

# (topic, partitions) -> {partition: next_offset}
OffsetSource = Callable[[str, list[int]], Awaitable[Mapping[int, int]]]


class PgOffsetsConsumer(AIOKafkaFaustConsumer):
    async def seek_to_committed(self) -> Mapping[TP, int]:
        committed: dict[TP, int] = dict(await super().seek_to_committed())
        source: OffsetSource | None = getattr(self.app, "offset_source", None)
        managed: set[str] = getattr(self.app, "managed_topics", set())
        if source is None or not managed:
            return committed
        by_topic: dict[str, list[int]] = {}
        for tp in self.assignment():
            if tp.topic in managed:
                by_topic.setdefault(tp.topic, []).append(tp.partition)
        seeks: dict[TP, int] = {}
        for topic, partitions in by_topic.items():
            stored = await source(topic, sorted(partitions))
            for partition in partitions:
                seeks[TP(topic, partition)] = int(stored.get(partition, 0))
        if seeks:
            await self.seek_wait(seeks)
            log.info(
                "seeked to postgres offsets %s",
                {f"{tp.topic}[{tp.partition}]": o for tp, o in sorted(seeks.items())},
            )
        committed.update(seeks)
        return committed


class PgOffsetsTransport(AIOKafkaTransport):
    Consumer: ClassVar[Any] = PgOffsetsConsumer


def register() -> str:
    """Make `pgkafka://host:port` resolve to this transport; returns the scheme."""
    TRANSPORTS.aliases[SCHEME] = f"{__name__}:PgOffsetsTransport"
    return SCHEME


register()


def app_options(settings: Any, app_id: str, partitions: int, **overrides: Any) -> dict[str, Any]:
    """Faust settings shared by every flashsend app (campaign sender, mail service, feedback):
    our offset-seeking transport, raw bytes (we decode ourselves so poison goes to the DLQ),
    no topic declaration, and group timeouts short enough that a killed worker loses its
    partitions in seconds rather than Faust's default minute (while a dead member is still
    in the group, every rebalance waits for it)."""
    register()
    options: dict[str, Any] = {
        "broker": f"{SCHEME}://{settings.kafka_bootstrap}",
        "value_serializer": "raw",
        "key_serializer": "raw",
        "store": "memory://",
        "topic_partitions": partitions,
        "topic_allow_declare": False,
        "topic_disable_leader": True,
        "consumer_auto_offset_reset": "earliest",
        "web_enabled": False,
        "broker_session_timeout": settings.group_session_timeout_s,
        "broker_heartbeat_interval": max(0.5, settings.group_session_timeout_s / 10),
        "broker_rebalance_timeout": settings.group_rebalance_timeout_s,
        "broker_commit_interval": 5.0,
        "datadir": str(settings.state_dir / "faust" / app_id),
    }
    options.update(overrides)
    return options


async def consume_batches(
    app: Any,
    stream: Any,
    handle: Callable[[list[Any]], Awaitable[Any]],
    what: str,
    *,
    take_max: int,
    within: float,
) -> AsyncIterator[None]:
    """The agent loop of every flashsend app: hand each batch of Kafka messages to `handle`.

    take_events() acks a batch even when the handler raises; carrying on would silently skip it
    until the next rebalance. So an error the handler could not absorb crashes the worker: the
    offsets stored in Postgres make the restart exact (design §4)."""
    async for events in stream.take_events(take_max, within=within):
        try:
            await handle([e.message for e in events])
        except Exception:
            log.exception("%s batch failed; stopping the worker", what)
            app._crash(RuntimeError(f"{what} batch failed"))
            raise
        yield None
