"""A Faust transport whose consumer seeks to offsets stored in PostgreSQL.

Faust re-seeks every assigned partition to the *broker-committed* offset after each rebalance
(`Consumer.perform_seek()` → `seek_to_committed()`), so a seek done in a rebalance callback is
overwritten. The one reliable place is `seek_to_committed()` itself: we override it to seek the
partitions of our managed topics to the `next_offset` stored in Postgres (written in the same
transaction as the claims), and let Faust handle any other partition as usual.

It is also where a worker becomes the owner of the partitions it was just assigned: the first
seek after `on_partitions_assigned` asks the store to take a new epoch for them
(sinks.offsets.Assignment), together with the topic's Kafka id and log bounds, so a recreated
topic is detected. Faust seeks again at other times (while its flow is stopped); those seeks
only read the stored offsets and never take an epoch, so a worker resumed after losing its
partitions (a zombie) cannot make itself their owner again before the group says so.

The transport is registered under the URL scheme `pgkafka://`; the app supplies the store
through `app.offset_source` (see streams/app.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any, ClassVar, NamedTuple, Protocol

from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient
from faust.transport.drivers import TRANSPORTS
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaFaustConsumer
from faust.transport.drivers.aiokafka import Transport as AIOKafkaTransport
from faust.transport.drivers.aiokafka import server_list
from faust.types import TP
from mode.services import WaitResults

from flashsend import health, metrics
from sinks.offsets import Assignment, PartitionOffsets, StoreUnavailable
from streams.rules.backoff import backoff_delay

log = logging.getLogger("flashsend.offsets")

SCHEME = "pgkafka"

# The assigned partitions of one topic -> {partition: next_offset}
OffsetSource = Callable[[Assignment], Awaitable[Mapping[int, int]]]
TOPIC_ID_TIMEOUT_S = 5.0


class TopicIds:
    """Kafka topic ids, through confluent-kafka's admin client (aiokafka's metadata requests
    predate topic ids). A topic deleted and created again under its name gets a new id."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._admin: AdminClient | None = None

    def get(self, topic: str) -> str | None:
        """The topic's id; None when the broker does not say (the caller then judges by the
        log bounds alone)."""
        try:
            if self._admin is None:
                self._admin = AdminClient({"bootstrap.servers": self.bootstrap})
            futures = self._admin.describe_topics(
                TopicCollection([topic]), request_timeout=TOPIC_ID_TIMEOUT_S
            )
            return str(futures[topic].result(timeout=TOPIC_ID_TIMEOUT_S).topic_id)
        except (KafkaException, TimeoutError, ValueError) as exc:
            log.warning("no topic id for %s: %s", topic, exc)
            return None


async def _resume(coro: Coroutine[Any, Any, Any], yielded: Any) -> Any:
    """Drive a coroutine whose first step already ran, the way asyncio.Task does: wait until
    the future it yielded is done (None: a bare yield), then send None — the coroutine reads
    the future's result or exception itself. Cancelling this coroutine cancels that future
    (or, if it is already done, throws the cancellation into the coroutine)."""
    while True:
        try:
            if yielded is None:
                await asyncio.sleep(0)
            else:
                # As asyncio.Task does before waiting on a yielded future; left set, awaiting
                # it again fails with "await wasn't used with future".
                yielded._asyncio_future_blocking = False
                await asyncio.wait([yielded])  # waits; leaves the outcome to the coroutine
        except asyncio.CancelledError as exc:
            if yielded is None or not yielded.cancel():
                try:
                    yielded = coro.throw(exc)
                except StopIteration as done:
                    return done.value
                continue
        try:
            yielded = coro.send(None)
        except StopIteration as done:
            return done.value


# How long one fetch waits for records (seconds) when none is buffered.
FETCH_TIMEOUT_S = 1.0
# How often a consumer refreshes the cluster's metadata (ms).
METADATA_MAX_AGE_MS = 10_000


class Consumed(NamedTuple):
    """One Kafka record as a batch handler reads it (the fields of a Faust message it uses;
    `timestamp` in epoch seconds, as Faust gives it; a tuple: one per record)."""

    topic: str
    partition: int
    offset: int
    timestamp: float | None
    key: bytes | None
    value: bytes | None
    headers: Any

    @classmethod
    def of(cls, rec: Any) -> Consumed:
        """From an aiokafka ConsumerRecord (timestamp in milliseconds)."""
        ts = rec.timestamp
        return cls(
            rec.topic,
            rec.partition,
            rec.offset,
            None if ts is None else ts / 1000.0,
            rec.key,
            rec.value,
            rec.headers,
        )


class BatchHandler(Protocol):
    """What an app with a `batch_handler` gives its consumer: `prepare` decodes a fetch,
    `commit` applies a prepared fetch and stores its offsets (one at a time, in order)."""

    async def prepare(self, records: list[Consumed]) -> Any: ...

    async def commit(self, prepared: Any) -> Any: ...


class PgOffsetsConsumer(AIOKafkaFaustConsumer):
    async def wait_first(self, *coros: Any, timeout: Any = None) -> WaitResults:
        """Fast path for the fetch loop's per-record `wait_first(callback(message),
        suspend_flow.wait())` (faust/transport/consumer.py, the only caller on a consumer).
        mode's wait_first builds four tasks and an asyncio.wait for every record: with py-spy
        that was ~10% of a campaign worker's CPU. When the callback finishes without
        suspending (the stream's buffer has room: the usual case) its result is returned at
        once. A callback that suspends goes on under mode's wait_first, so a flow suspension
        (rebalance), stop or crash still interrupts it exactly as before."""
        if (
            len(coros) != 2
            or timeout is not None
            or not all(inspect.iscoroutine(c) for c in coros)
            or self.suspend_flow.is_set()
            or self._stopped.is_set()
            or self._crashed.is_set()
        ):
            return await super().wait_first(*coros, timeout=timeout)
        callback, suspended = coros
        try:
            yielded = callback.send(None)
        except StopIteration as done:
            suspended.close()
            return WaitResults([callback], [done.value], False)
        except BaseException:
            suspended.close()
            raise
        return await super().wait_first(_resume(callback, yielded), suspended)

    async def _drain_messages(self, fetcher: Any) -> None:
        """Faust's fetch loop, or, for an app with a `batch_handler`, the batch loop below."""
        handler: BatchHandler | None = getattr(self.app, "batch_handler", None)
        if handler is None:
            await super()._drain_messages(fetcher)
            return
        await self._drain_batches(fetcher, handler)

    async def _drain_batches(self, fetcher: Any, handler: BatchHandler) -> None:
        """Each fetch goes to `handler` whole, as plain records: none of Faust's per-record
        path (message, event, stream buffer, ack) runs. Nothing is lost by skipping it: the
        offsets that count are the ones `handler` stores in PostgreSQL with its effects, and a
        fetch cut short by a rebalance is read again from them after the seek (records of a
        partition that moved meanwhile are fenced off by its owner epoch, sinks.offsets).

        The next fetch is read and prepared while the previous one's commit is in flight; the
        commits themselves run one after the other, in fetch order."""
        inflight: asyncio.Task[Any] | None = None
        try:
            while not (self._stopped.is_set() or fetcher._stopped.is_set()):
                records, active = await self._wait_next_records(FETCH_TIMEOUT_S)
                generation = self.app.consumer_generation_id
                if not records or self.should_stop or not self.flow_active:
                    await asyncio.sleep(0)
                    continue
                batch = [
                    Consumed.of(rec)
                    for tp, recs in records.items()
                    if active is None or tp in active
                    for rec in recs
                ]
                if not batch or self.app.consumer_generation_id != generation:
                    continue
                prepared = await handler.prepare(batch)
                if inflight is not None:
                    # A stop meanwhile lets it finish (shielded); its failure stops the worker.
                    await asyncio.shield(inflight)
                inflight = asyncio.create_task(handler.commit(prepared))
                for tp, recs in records.items():
                    if recs:
                        self._read_offset[tp] = recs[-1].offset
        finally:
            if inflight is not None and not inflight.done():
                with contextlib.suppress(Exception):
                    await asyncio.shield(inflight)  # a commit under way finishes

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        # The next seek takes a new epoch for these (an eager rebalance assigns every
        # partition again, so each member of the new generation takes all of its own).
        self._to_take = set(assigned)
        await super().on_partitions_assigned(assigned, generation_id)

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
        to_take: set[TP] = getattr(self, "_to_take", set())
        seeks: dict[TP, int] = {}
        for topic, partitions in by_topic.items():
            new = frozenset(p for p in partitions if TP(topic, p) in to_take)
            assignment = await self._describe(topic, sorted(partitions), new)
            stored = await source(assignment)
            to_take.difference_update(TP(topic, p) for p in new)
            for partition in partitions:
                seeks[TP(topic, partition)] = int(stored.get(partition, 0))
        if seeks:
            await self.seek_wait(seeks)
            log.info(
                "seeked to postgres offsets %s",
                {f"{tp.topic}[{tp.partition}]": o for tp, o in sorted(seeks.items())},
            )
        committed.update(seeks)
        health.PROBE.done(health.ASSIGNED)
        return committed

    async def _describe(self, topic: str, partitions: list[int], new: frozenset[int]) -> Assignment:
        """The assignment of `topic`, with its id and the log bounds of the new partitions."""
        if not new:
            return Assignment(topic, tuple(partitions), new)
        tps = [TP(topic, p) for p in sorted(new)]
        ids: TopicIds | None = getattr(self, "_topic_ids", None)
        if ids is None:
            transport: Any = self.transport
            bootstrap = ",".join(server_list(transport.url, transport.default_port))
            ids = self._topic_ids = TopicIds(bootstrap)
        topic_id = await asyncio.to_thread(ids.get, topic)
        try:
            start = await self.earliest_offsets(*tps)
            end = await self.highwaters(*tps)
        except Exception as exc:  # the store then keeps the stored offsets as they are
            log.warning("no log bounds for %s: %s", topic, exc)
            start, end = {}, {}
        return Assignment(
            topic,
            tuple(partitions),
            new,
            topic_id,
            {tp.partition: int(o) for tp, o in start.items() if o is not None},
            {tp.partition: int(o) for tp, o in end.items() if o is not None},
        )


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
        # A rebalance led while a topic is missing from the metadata (a broker just restarted)
        # assigns none of its partitions; the member asks again once a metadata refresh shows
        # them, every 5 minutes by default: meanwhile that topic is not consumed at all.
        "consumer_metadata_max_age_ms": METADATA_MAX_AGE_MS,
        "datadir": str(settings.state_dir / "faust" / app_id),
    }
    if getattr(settings, "worker_instance", ""):
        options["consumer_group_instance_id"] = f"{app_id}-{settings.worker_instance}"
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
    offsets stored in Postgres make the restart exact (docs/architecture.md §4)."""
    async for events in stream.take_events(take_max, within=within):
        try:
            await handle([e.message for e in events])
            if events:
                metrics.count_ingested(events[0].message.topic, len(events))
        except Exception:
            log.exception("%s batch failed; stopping the worker", what)
            app._crash(RuntimeError(f"{what} batch failed"))
            raise
        yield None


_RETRY_RNG = random.Random()  # jitter of the retries below


async def take_waiting(offsets: PartitionOffsets, assignment: Assignment) -> dict[int, int]:
    """`offsets.take(assignment)`, waiting out PostgreSQL being down or restarting: an error
    here escapes into Faust's recovery, which crashes the worker."""
    attempt = 0
    while True:
        try:
            return await offsets.take(assignment)
        except StoreUnavailable as exc:
            attempt += 1
            delay = backoff_delay(min(attempt, 10), base=0.1, cap=2.0, rng=_RETRY_RNG)
            log.warning("taking offsets failed (attempt %d), retrying: %s", attempt, exc)
            await asyncio.sleep(delay)
