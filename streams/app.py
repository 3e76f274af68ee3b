"""The Faust application: topics, the sender agent, and the resources it shares (pools,
SES client, campaign cache). Built by `create_app(settings)`; run by `flashsend worker`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import faust
from faust.types import TP
from psycopg_pool import AsyncConnectionPool

from flashsend import deliverability, health
from flashsend.settings import Settings
from producers.dlq import DeadLetterProducer
from producers.reconcile import Reconciler
from schemas import serde
from sinks import metrics_state
from sinks.offsets import Assignment
from sinks.push import PushSender, make_push_client
from sinks.push_store import PushStore
from sinks.recipient_store import RecipientStore
from sinks.ses import SesSender, make_client
from sinks.sms import SmsSender, make_sms_client
from streams import faust_offsets
from streams.campaign_state import CampaignCache
from streams.push_channel import PushChannel
from streams.sender import CampaignSender, PartitionFlow, SenderConfig
from streams.sms_channel import SmsChannel

log = logging.getLogger("flashsend.app")

TAKE_MAX = 100  # doorbells (of up to DOORBELL_BLOCK recipients) per batch handed to the sender
TAKE_WITHIN_S = 0.05  # small: buffered events are unacked and would stall rebalances
# Bytes per partition per fetch (Faust's default 1 MB is ~150,000 recipients): about one
# producer batch of DOORBELL_BATCH_RECORDS, so every fetch brings every partition a little.
DOORBELL_FETCH_BYTES = 4_096
# Doorbells Faust may buffer between the fetcher and the agent (its default is 4,096, ~100,000
# recipients). Faust stops fetching a partition that puts a record into a buffer filled past
# 80 %, and fetches it again only once the buffer has drained to 40 % (mode's
# FlowControlQueue). With 4,096, and the agent waiting for one full partition, a partition
# still being fetched refilled the buffer with its own doorbells while the other partitions of
# that worker waited for 40 %, which at one lane's pace took 24 s: five of a worker's six
# partitions sent nothing for 24 s in a 1M bench
# (docs/decisions.md). The sender pauses its own full partitions (FaustPartitionFlow) and
# never makes the stream wait for one, so this buffer only has to cover a fetch or two:
# 6 partitions x ~24 doorbells of DOORBELL_FETCH_BYTES each.
STREAM_BUFFER_DOORBELLS = 256


class FaustPartitionFlow:
    """The sender's PartitionFlow on the Faust consumer, through the calls Faust's own buffer
    control makes (`on_buffer_full` / `on_buffer_drop`): the partition leaves the fetch, and
    records already fetched for it are still delivered. `pause_partitions` is not usable here:
    Faust drops fetched records of a partition paused while it iterates over them, and in a
    400k bench every partition lost its last doorbells that way (re-produced by reconcile
    ~2 s later)."""

    def __init__(self, app: faust.App, topic: str) -> None:
        self.app = app
        self.topic = topic

    def pause(self, partitions: set[int]) -> None:
        for p in partitions:
            self.app.consumer.on_buffer_full(TP(self.topic, p))

    def resume(self, partitions: set[int]) -> None:
        for p in partitions:
            self.app.consumer.on_buffer_drop(TP(self.topic, p))


class Runtime:
    """Resources created once per worker, lazily, inside the worker's event loop."""

    def __init__(self, settings: Settings, flow: PartitionFlow | None = None) -> None:
        self.settings = settings
        self.flow = flow  # the sender's fetch control (None: the agent waits instead)
        self._lock = asyncio.Lock()
        self.pool: AsyncConnectionPool | None = None
        self.store: RecipientStore | None = None
        self.sender: CampaignSender | None = None
        self.campaigns: CampaignCache | None = None

    async def ensure_started(self) -> CampaignSender:
        async with self._lock:
            if self.sender is not None:
                return self.sender
            s = self.settings
            pool = AsyncConnectionPool(
                s.pg_dsn, min_size=2, max_size=8, open=False, kwargs={"autocommit": True}
            )
            await pool.open(wait=True, timeout=60)
            self.pool = pool
            self.store = RecipientStore(pool, group_id=s.group_sender, topic=s.topic_recipients)
            self.campaigns = CampaignCache(self.store, max_feedback_lag_s=s.feedback_max_lag_s)
            await self.campaigns.refresh()
            self.campaigns.start()
            self.sender = CampaignSender(
                config=SenderConfig(
                    partitions=s.partitions,
                    max_inflight_calls=s.inflight_calls,
                    window_slack=s.window_slack,
                ),
                store=self.store,
                ses=SesSender(make_client(s, pool=s.inflight_calls * 2)),
                campaigns=self.campaigns,
                codec=serde.codec(s, "campaign_recipient"),
                dlq=DeadLetterProducer(s.kafka_bootstrap, s.topic_dlq),
                headers_for=deliverability.unsubscribe_headers(s),  # RFC 8058 one-click
                flow=self.flow,
                channels={
                    "sms": SmsChannel(
                        lambda: SmsSender(make_sms_client(s, pool=s.sms_inflight_calls * 2)),
                        inflight=s.sms_inflight_calls,
                        is_sending=self.campaigns.is_sending,
                        call_size=s.sms_call_size,
                    ),
                    "push": PushChannel(
                        lambda: PushSender(make_push_client(s, pool=s.push_inflight_calls * 2)),
                        PushStore(pool),
                        inflight=s.push_inflight_calls,
                        is_sending=self.campaigns.is_sending,
                        call_size=s.push_call_size,
                    ),
                },
            )
            health.PROBE.expect(health.ASSIGNED)  # /readyz: after the first assignment's seek
            health.start_heartbeat()  # /healthz
            await asyncio.to_thread(metrics_state.start, s, "campaign")  # /metrics
            return self.sender

    async def offsets(self, assignment: Assignment) -> Mapping[int, int]:
        """The transport's offset source: take the assigned partitions (sinks.offsets).
        PostgreSQL being down or restarting is waited out: an error here crashes the worker
        (Faust's recovery)."""
        await self.ensure_started()
        assert self.store is not None
        if assignment.topic != self.store.topic:
            return {}
        return await faust_offsets.take_waiting(self.store.offsets, assignment)

    async def stop(self) -> None:
        if self.sender is not None:
            await self.sender.stop()
        if self.campaigns is not None:
            await self.campaigns.stop()
        if self.pool is not None:
            await self.pool.close()


class RawBytes(faust.Schema[bytes, bytes]):
    """Keys and values handed to the agent as the bytes on the wire. The agent decodes the
    Avro doorbell itself (once, when it queues the record); Faust's codec registry would only
    pass the bytes through, at ~2.5 % of a worker's CPU (py-spy, docs/decisions.md)."""

    def loads_key(self, app: Any, message: Any, **_: Any) -> Any:
        return message.key

    def loads_value(self, app: Any, message: Any, **_: Any) -> Any:
        return message.value


class FlashsendApp(faust.App):
    runtime: Runtime
    offset_source: Any
    managed_topics: set[str]


def create_app(settings: Settings) -> FlashsendApp:
    app = FlashsendApp(
        settings.app_id,
        **faust_offsets.app_options(
            settings,
            settings.app_id,
            settings.partitions,
            broker_commit_every=1000,
            stream_buffer_maxsize=STREAM_BUFFER_DOORBELLS,
            producer_linger_ms=5,
            consumer_max_fetch_size=DOORBELL_FETCH_BYTES,
        ),
    )
    runtime = Runtime(settings, FaustPartitionFlow(app, settings.topic_recipients))
    app.runtime = runtime
    app.offset_source = runtime.offsets
    app.managed_topics = {settings.topic_recipients}

    recipients = app.topic(
        settings.topic_recipients,
        partitions=settings.partitions,
        schema=RawBytes(key_serializer="raw", value_serializer="raw"),
        internal=False,
    )

    @app.agent(recipients, name="campaign-sender")
    async def campaign_sender(stream: Any) -> AsyncIterator[None]:
        sender = await runtime.ensure_started()
        async for _ in faust_offsets.consume_batches(
            app, stream, sender.handle, "sender", take_max=TAKE_MAX, within=TAKE_WITHIN_S
        ):
            yield None

    reconciler: list[Reconciler] = []

    @app.timer(interval=settings.reconcile_interval_s)  # type: ignore[untyped-decorator]
    async def _reconcile() -> None:
        """Repair loop on every worker (an advisory lock lets one run per campaign at a time):
        expired leases → unknown, released rows and lost doorbells → produced again."""
        if runtime.campaigns is None:
            return
        if runtime.sender is not None:
            log.info(
                "sender backlog=%d lanes=%s stats=%s",
                runtime.sender.backlog(),
                {p: lane.backlog for p, lane in sorted(runtime.sender.lanes.items())},
                runtime.sender.stats,
            )
        if not reconciler:
            reconciler.append(await asyncio.to_thread(Reconciler, settings))
        for campaign in runtime.campaigns.live():
            if campaign.status not in ("sending", "cancelled"):
                continue
            try:
                result = await asyncio.to_thread(reconciler[0].reconcile, campaign.id)
            except Exception as exc:  # the next tick retries; never take the worker down
                log.warning("reconcile of campaign %s failed: %s", campaign.id, exc)
                continue
            if result.expired or result.requeued or result.orphans or result.done:
                log.info("reconcile %s", result.as_dict())

    # The eager rebalance protocol revokes every partition before each assignment. Lanes only
    # hold their calls on revocation and act on the assignment that follows: the partitions we
    # keep go on with their pacers, the ones that move stop before their new owner starts.
    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def _revoked(app: faust.App, revoked: set[Any], **kwargs: Any) -> None:
        if runtime.sender is not None:
            await runtime.sender.suspend(
                {tp.partition for tp in revoked if tp.topic == settings.topic_recipients}
            )

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def _assigned(app: faust.App, assigned: set[Any], **kwargs: Any) -> None:
        if runtime.sender is not None:
            await runtime.sender.reassign(
                {tp.partition for tp in assigned if tp.topic == settings.topic_recipients}
            )

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def _stop_runtime(app: faust.App, **kwargs: Any) -> None:
        await runtime.stop()
        for kept in reconciler:
            await asyncio.to_thread(kept.close)

    return app
