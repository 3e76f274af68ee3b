"""`flashsend events pull`: SES events from an SQS queue onto mail.events.

SES → SNS → SQS (raw message delivery) → here → mail.events → the feedback worker. Each
message body is the SES event JSON itself (raw delivery: no SNS envelope, so no signature to
check). What stands in for the signature: the queue's access policy lets only our SNS topic
send to it (`flashsend aws apply` writes it), and every body must parse as an event the
webhook accepts (`producers.event_messages.parse_event_message`: an SES event, an SMS event or
reply); anything else is poison.

Several pullers (asyncio tasks) each loop: ReceiveMessage (10 messages, long poll) → parse →
publish the records (`out_records`, the webhook's own function, so the records are the
webhook's) → wait for the broker's ack → DeleteMessageBatch. So:

- a message is deleted only after Kafka acknowledged its records: a crash or a broker outage
  leaves it in SQS, where it becomes visible again after the visibility timeout and is pulled
  again (records are then produced twice at worst; consumers dedupe on event_id);
- poison (a body that is not a readable SES event) goes to the dead-letter topic with its
  reason, and is deleted once the DLQ acknowledged it (not tried while the broker does not
  acknowledge: it stays in SQS like the rest);
- when the broker fails to acknowledge, every puller stops receiving until the broker answers
  metadata again (`BrokerGate`): a receive during an outage would only raise the message's
  receive count towards the queue's maxReceiveCount, after which SQS moves it to the SQS
  dead-letter queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka.admin import AdminClient

from flashsend.settings import Settings
from producers.dlq import DeadLetter, DeadLetterFailed, DeadLetterProducer
from producers.event_messages import parse_event_message
from producers.event_publisher import EventPublisher, PublishFailed
from producers.ses_events import SCHEMA, SesEventInvalid
from producers.ses_records import out_records
from producers.sqs_client import SqsClient, SqsError, SqsMessage
from schemas.serde import AvroCodec, registry_client

log = logging.getLogger("flashsend.events.pull")

SQS_ID_PREFIX = "sqs:"  # the records' sns_message_id on this path: the SQS MessageId
STATS_EVERY_S = 10.0
_ENVELOPE_KEYS = ('"TopicArn"', '"Type"', '"Message"')


def read_message(message: SqsMessage, received_at_ms: int) -> list[dict[str, Any]]:
    """The records of one SQS message (pure); SesEventInvalid when it is poison.

    A body that is an SNS envelope means the subscription lacks RawMessageDelivery: named as
    such, since the fix is in the subscription, not in the event."""
    try:
        return parse_event_message(
            message.body,
            sns_message_id=SQS_ID_PREFIX + message.message_id,
            received_at_ms=received_at_ms,
        )
    except SesEventInvalid as exc:
        if exc.reason == "no_event_type" and all(k in message.body for k in _ENVELOPE_KEYS):
            raise SesEventInvalid(
                "not_raw_delivery", "an SNS envelope: set RawMessageDelivery on the subscription"
            ) from None
        raise


def backoff_s(failures: int, cap_s: float, rng: random.Random | None = None) -> float:
    """Full-jitter exponential backoff (pure but for the draw): 0.5 s, 1 s, … up to cap."""
    ceiling = min(cap_s, 0.5 * 2 ** min(failures, 16))
    return (rng or random).uniform(ceiling / 2, ceiling)


@dataclass(frozen=True)
class PullerConfig:
    queue_url: str
    pullers: int = 4
    wait_s: int = 20
    visibility_s: int = 60
    backoff_cap_s: float = 30.0


class BrokerGate:
    """Open while the broker is believed up. A failed publish closes it; one probe task then
    asks the broker for the topic's metadata until it answers, calls `on_reopen` (the puller
    renews its producer there) and opens it again."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        probe_every_s: float = 1.0,
        on_reopen: Callable[[], None] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.probe_every_s = probe_every_s
        self.on_reopen = on_reopen
        self.closed_s = 0.0  # time spent closed, in total
        self._open = asyncio.Event()
        self._open.set()
        self._closed_at: float | None = None
        self._probe: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    async def wait_open(self) -> None:
        await self._open.wait()

    def close(self) -> None:
        if not self._open.is_set():
            return
        self._open.clear()
        self._closed_at = time.monotonic()
        log.warning("broker not acknowledging: pullers wait until it answers again")
        self._probe = asyncio.get_running_loop().create_task(self._probe_until_up())

    async def _probe_until_up(self) -> None:
        failures = 0
        while not await asyncio.to_thread(self._broker_answers):
            failures += 1
            await asyncio.sleep(min(5.0, self.probe_every_s * failures))
        if self._closed_at is not None:
            self.closed_s += time.monotonic() - self._closed_at
        self._closed_at = None
        if self.on_reopen is not None:
            self.on_reopen()
        log.info("broker answers again: pulling resumes")
        self._open.set()

    def _broker_answers(self) -> bool:
        admin = AdminClient(
            {"bootstrap.servers": self.bootstrap, "socket.connection.setup.timeout.ms": 2000}
        )
        try:
            topic = admin.list_topics(self.topic, timeout=3.0).topics.get(self.topic)
        except Exception:  # any failure: not up yet
            return False
        return (
            topic is not None
            and topic.error is None
            and bool(topic.partitions)
            and all(p.leader >= 0 and p.error is None for p in topic.partitions.values())
        )

    async def stop(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe


class SqsPuller:
    def __init__(
        self,
        config: PullerConfig,
        *,
        sqs: SqsClient,
        publisher: EventPublisher,
        dlq: DeadLetterProducer,
        codec: AvroCodec,
        gate: BrokerGate,
    ) -> None:
        self.config = config
        self.sqs = sqs
        self.publisher = publisher
        self.dlq = dlq
        self.codec = codec
        self.gate = gate
        self.stats: Counter[str] = Counter()
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Finish the batches in hand, start no new receive."""
        self._stopping.set()

    async def run(self) -> None:
        tasks = [
            asyncio.create_task(self._loop(i), name=f"puller-{i}")
            for i in range(self.config.pullers)
        ]
        reporter = asyncio.create_task(self._report())
        try:
            await asyncio.gather(*tasks)
        finally:
            reporter.cancel()
            await self.gate.stop()
            log.info("stopped %s", json.dumps(self.summary(), sort_keys=True))

    async def _loop(self, worker: int) -> None:
        failures = 0
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            while not self._stopping.is_set():
                if not self.gate.is_open:
                    opened = asyncio.ensure_future(self.gate.wait_open())
                    await asyncio.wait([opened, stopping], return_when=asyncio.FIRST_COMPLETED)
                    opened.cancel()
                    if self._stopping.is_set():
                        break
                receive = asyncio.create_task(
                    self.sqs.receive(
                        self.config.queue_url,
                        wait_s=self.config.wait_s,
                        visibility_s=self.config.visibility_s,
                    )
                )
                # A long poll in progress holds no message yet: on stop it is abandoned. A
                # batch in hand is always finished (published, deleted) before the loop ends.
                await asyncio.wait([receive, stopping], return_when=asyncio.FIRST_COMPLETED)
                if not receive.done():
                    receive.cancel()
                    with contextlib.suppress(asyncio.CancelledError, SqsError):
                        await receive
                    break
                try:
                    messages = receive.result()
                except SqsError as exc:
                    failures += 1
                    self.stats["receive_errors"] += 1
                    log.warning("puller %d: receive failed (%s), retrying", worker, exc)
                    await asyncio.wait(
                        [stopping], timeout=backoff_s(failures, self.config.backoff_cap_s)
                    )
                    continue
                failures = 0
                self.stats["receives"] += 1
                if messages:
                    await self.handle(messages)
        finally:
            stopping.cancel()

    async def handle(self, messages: Sequence[SqsMessage]) -> None:
        """Publish one received batch; delete what Kafka (or the DLQ) acknowledged."""
        self.stats["received"] += len(messages)
        now_ms = int(time.time() * 1000)
        good: list[SqsMessage] = []
        records: list[dict[str, Any]] = []
        poison: list[tuple[SqsMessage, SesEventInvalid]] = []
        for message in messages:
            try:
                records.extend(read_message(message, now_ms))
            except SesEventInvalid as exc:
                poison.append((message, exc))
                continue
            good.append(message)
        done: list[str] = []
        if good:
            try:
                await self.publisher.publish(out_records(records, self.codec))
            except PublishFailed as exc:
                self.stats["publish_failed"] += len(good)
                log.warning("not acknowledged, left in SQS for redelivery: %s", exc)
                self.gate.close()
            else:
                self.stats["records"] += len(records)
                self.stats["published"] += len(good)
                done.extend(m.receipt_handle for m in good)
        if poison and self.gate.is_open:  # else the dead-letter topic's broker is down too
            done.extend(await self._dead_letter(poison))
        elif poison:
            self.stats["dead_letter_deferred"] += len(poison)
        await self._delete(done)

    async def _dead_letter(self, poison: Sequence[tuple[SqsMessage, SesEventInvalid]]) -> list[str]:
        letters = [
            DeadLetter(
                self.config.queue_url,
                0,
                0,
                m.message_id.encode(),
                m.body.encode(),
                exc.reason,
                str(exc),
                (("sqs.receive_count", str(m.receive_count).encode()),),
            )
            for m, exc in poison
        ]
        try:
            await self.dlq.publish(letters)
        except DeadLetterFailed as exc:
            self.stats["dead_letter_failed"] += len(letters)
            log.warning("dead letters not acknowledged, left in SQS: %s", exc)
            self.gate.close()
            return []
        for _m, invalid in poison:
            self.stats[f"dead:{invalid.reason}"] += 1
            log.warning("unreadable SQS message dead-lettered reason=%s", invalid.reason)
        return [m.receipt_handle for m, _exc in poison]

    async def _delete(self, receipts: Sequence[str]) -> None:
        if not receipts:
            return
        try:
            failed = await self.sqs.delete(self.config.queue_url, receipts)
        except SqsError as exc:
            failed = list(receipts)
            log.warning("delete failed (messages will be pulled again): %s", exc)
        self.stats["deleted"] += len(receipts) - len(failed)
        self.stats["delete_failed"] += len(failed)

    def summary(self) -> dict[str, Any]:
        return {**self.stats, "gate_closed_s": round(self.gate.closed_s, 1)}

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(STATS_EVERY_S)
            log.info("stats %s", json.dumps(self.summary(), sort_keys=True))


async def pull(
    settings: Settings,
    config: PullerConfig,
    stop: asyncio.Event,
    *,
    ensure_topics: bool = True,
) -> dict[str, Any]:
    """Pull until `stop` is set; return the counters."""
    if ensure_topics:  # in the background: Kafka may be down, and SQS keeps the events
        threading.Thread(
            target=_ensure_topics, args=(settings,), name="ensure-topics", daemon=True
        ).start()
    sqs = SqsClient.for_settings(settings, connections=config.pullers * 2 + 2)
    publisher = EventPublisher(
        settings.kafka_bootstrap,
        settings.topic_mail_events,
        timeout_s=min(settings.webhook_publish_timeout_s, config.visibility_s / 3),
    )
    puller = SqsPuller(
        config,
        sqs=sqs,
        publisher=publisher,
        dlq=DeadLetterProducer(settings.kafka_bootstrap, settings.topic_dlq),
        codec=AvroCodec(registry_client(settings.schema_registry_url), SCHEMA),
        gate=BrokerGate(
            settings.kafka_bootstrap, settings.topic_mail_events, on_reopen=publisher.renew
        ),
    )
    stopper = asyncio.create_task(_stop_on(stop, puller))
    try:
        await puller.run()
    finally:
        stopper.cancel()
        await sqs.close()
        await asyncio.to_thread(publisher.close, 5.0)
    return puller.summary()


async def _stop_on(stop: asyncio.Event, puller: SqsPuller) -> None:
    await stop.wait()
    puller.stop()


def _ensure_topics(settings: Settings) -> None:
    from flashsend.errors import FlashsendError
    from producers.mail_topics import ensure_mail_topics

    try:
        ensure_mail_topics(settings, timeout=10.0)
    except FlashsendError as exc:
        log.warning("could not ensure topics (Kafka down?): %s", exc)


def run_pull(settings: Settings, config: PullerConfig, loglevel: str = "info") -> int:
    """`flashsend events pull`: pull until SIGTERM/SIGINT (or the parent exits, for a run
    started by a test or bench)."""
    from flashsend.logs import configure

    configure(settings.log_format, loglevel)

    async def main() -> dict[str, Any]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        watchdog = None
        if settings.worker_exit_with_parent:
            watchdog = asyncio.create_task(_stop_when_orphaned(stop))
        log.info(
            "pulling %s with %d pullers onto %s",
            config.queue_url,
            config.pullers,
            settings.topic_mail_events,
        )
        print(f"pulling {config.queue_url} with {config.pullers} pullers", flush=True)
        try:
            return await pull(settings, config, stop)
        finally:
            if watchdog is not None:
                watchdog.cancel()

    asyncio.run(main())
    return 0


async def _stop_when_orphaned(stop: asyncio.Event) -> None:
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(1.0)
    stop.set()
