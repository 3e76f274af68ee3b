"""Publish records to Kafka from asyncio code and wait for the broker's acknowledgement.

The webhook may answer SNS 200 only once every record of a notification is acknowledged
(`acks=all`, idempotent producer): a 200 before the ack would lose the event if the broker then
failed, since SNS does not retry after a 200. Many concurrent requests share one producer, so
the records of many notifications travel in one broker request (`linger.ms`), which is where
the webhook's throughput comes from.

Delivery reports are served on the event loop itself: while records are in flight, a task
calls `poll(0)` once per loop pass (at most every `POLL_EVERY_S`), and each report settles its
notification's future directly. No poll thread: a thread would wake the loop through its
self-pipe once per record and contend for the GIL with the request handlers. The same task
expires notifications not acknowledged in time; every call waits equally long, so the oldest
waiting call is always the next to expire and no per-call timer is needed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from flashsend.errors import FlashsendError

Headers = list[tuple[str, str | bytes | None]]

POLL_EVERY_S = 0.001
LINGER_MS = 5
# Calls failing this long in a row get a new producer (at most once per this long): a producer
# was seen timing out every record for minutes after a broker outage while a new client found
# the broker up. A producer that works again resets the clock with its first acknowledgement.
RENEW_AFTER_S = 30.0


class PublishFailed(FlashsendError):
    """The broker did not acknowledge the records (answer 5xx: SNS retries)."""


@dataclass(frozen=True)
class OutRecord:
    key: bytes
    value: bytes
    headers: Headers


class _ProduceRefused(Exception):
    """produce() raised (its cause): the local queue is full or the producer is unusable."""


class _Pending:
    """One publish() call: settled when the last of its records is reported."""

    __slots__ = ("deadline", "error", "future", "loop", "loop_thread", "remaining")

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int, deadline: float) -> None:
        self.loop = loop
        self.loop_thread = threading.get_ident()  # created by publish(), on the loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.remaining = count
        self.deadline = deadline  # loop.time()
        self.error: KafkaError | None = None

    def on_delivery(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None and self.error is None:
            self.error = err
        self.remaining -= 1
        if self.remaining == 0:
            if threading.get_ident() == self.loop_thread:
                self._settle()
            else:  # a report served by close()'s flush, from another thread
                self.loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        if self.future.done():
            return
        if self.error is None:
            self.future.set_result(None)
        else:
            self.future.set_exception(KafkaException(self.error))


class EventPublisher:
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        timeout_s: float = 10.0,
        linger_ms: int = LINGER_MS,
        max_queued: int = 200_000,
        renew_after_s: float = RENEW_AFTER_S,
    ) -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        self.renew_after_s = renew_after_s
        self.published = 0
        self.renewals = 0
        self._failing_since: float | None = None
        self._renewed_at = float("-inf")
        self._config = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": linger_ms,
            "compression.type": "lz4",
            "message.timeout.ms": int(timeout_s * 1000),
            "socket.connection.setup.timeout.ms": 5000,
            "queue.buffering.max.messages": max_queued,
        }
        self._producer = Producer(self._config)
        self._poller: asyncio.Task[None] | None = None
        self._batch: list[tuple[Sequence[OutRecord], _Pending]] = []  # produced at the pass's end
        self._waiting: deque[_Pending] = deque()  # oldest first

    async def publish(self, records: Sequence[OutRecord]) -> None:
        """Return once every record is acknowledged; PublishFailed otherwise.

        The records are produced at the end of this loop pass together with those of every
        other call made in it: librdkafka takes a run of produce() calls for a fraction of
        what the same calls cost one by one between requests."""
        if not records:
            return
        loop = asyncio.get_running_loop()
        pending = _Pending(loop, len(records), loop.time() + self.timeout_s + 1.0)
        self._batch.append((records, pending))
        if len(self._batch) == 1:
            loop.call_soon(self._produce_batch)
        try:
            await pending.future
        except TimeoutError as exc:
            self._failed()
            raise PublishFailed("no broker acknowledgement in time") from exc
        except KafkaException as exc:
            self._failed()
            raise PublishFailed(f"delivery: {exc}") from exc
        except _ProduceRefused as exc:
            self._failed()
            raise PublishFailed(f"produce: {exc.__cause__}") from exc.__cause__
        self._failing_since = None
        self.published += len(records)

    def _failed(self) -> None:
        """Renew the producer once calls have failed `renew_after_s` in a row, and again at
        most that often while they go on failing (during an outage a new producer fails
        too, and costs only the records in flight, which fail as they would anyway)."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        elif now - max(self._failing_since, self._renewed_at) >= self.renew_after_s:
            self.renew()

    def _produce_batch(self) -> None:
        batch, self._batch = self._batch, []
        produce, topic = self._producer.produce, self.topic
        for records, pending in batch:
            produced = 0
            try:
                for record in records:
                    produce(
                        topic,
                        key=record.key,
                        value=record.value,
                        headers=record.headers,
                        on_delivery=pending.on_delivery,
                    )
                    produced += 1
            except (KafkaException, BufferError) as exc:
                pending.remaining -= len(records) - produced  # the produced ones still report
                if not pending.future.done():
                    refused = _ProduceRefused()
                    refused.__cause__ = exc
                    pending.future.set_exception(refused)
            if produced:
                self._waiting.append(pending)
        self._ensure_poller()

    def _ensure_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll_while_in_flight())

    async def _poll_while_in_flight(self) -> None:
        loop = asyncio.get_running_loop()
        waiting = self._waiting
        # len(producer): records queued, in flight, or acknowledged with the report unserved.
        while len(self._producer) or waiting:
            self._producer.poll(0)
            now = loop.time()
            while waiting and (waiting[0].future.done() or waiting[0].deadline <= now):
                expired = waiting.popleft()
                if not expired.future.done():
                    expired.future.set_exception(TimeoutError())
            await asyncio.sleep(POLL_EVERY_S)

    def renew(self) -> None:
        """Go on with a new producer; what the old one holds fails now (its callers answer
        as for any unacknowledged record: the event is retried).

        Once the broker is back after an outage: an idempotent producer whose records had
        timed out across a broker restart was seen to time out every later record for minutes
        while a new client found the broker up and the topic led. The old producer's records
        may still have reached the broker: a retried event is a duplicate, which every
        consumer of mail.events absorbs."""
        old, self._producer = self._producer, Producer(self._config)
        self.renewals += 1
        self._renewed_at = time.monotonic()
        old.purge(in_queue=True, in_flight=True, blocking=False)
        old.poll(0)  # the purged records' reports: their calls fail now

    def close(self, timeout: float = 5.0) -> None:
        """Flush what is queued (blocking: call it off the event loop)."""
        self._producer.flush(timeout)
