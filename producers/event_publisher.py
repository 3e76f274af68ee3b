"""Publish records to Kafka from asyncio code and wait for the broker's acknowledgement.

The webhook may answer SNS 200 only once every record of a notification is acknowledged
(`acks=all`, idempotent producer): a 200 before the ack would lose the event if the broker then
failed, since SNS does not retry after a 200. A poll thread runs the delivery callbacks and
hands each result to the waiting request through its event loop. Many concurrent requests
share one producer, so the records of many notifications travel in one broker request
(`linger.ms`), which is where the webhook's throughput comes from.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, Producer

from flashsend.errors import FlashsendError

Headers = list[tuple[str, str | bytes | None]]


class PublishFailed(FlashsendError):
    """The broker did not acknowledge the records (answer 5xx: SNS retries)."""


@dataclass(frozen=True)
class OutRecord:
    key: bytes
    value: bytes
    headers: Headers


class EventPublisher:
    def __init__(self, bootstrap: str, topic: str, *, timeout_s: float = 10.0) -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        self.published = 0
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "compression.type": "lz4",
                "message.timeout.ms": int(timeout_s * 1000),
                "socket.connection.setup.timeout.ms": 5000,
                "queue.buffering.max.messages": 200_000,
            }
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="publisher-poll", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    async def publish(self, records: Sequence[OutRecord]) -> None:
        """Return once every record is acknowledged; PublishFailed otherwise."""
        if not records:
            return
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[None]] = []

        def callback(fut: asyncio.Future[None]) -> Any:
            def on_delivery(err: Any, _msg: Any) -> None:
                loop.call_soon_threadsafe(_settle, fut, err)

            return on_delivery

        try:
            for record in records:
                fut: asyncio.Future[None] = loop.create_future()
                self._producer.produce(
                    self.topic,
                    key=record.key,
                    value=record.value,
                    headers=record.headers,
                    on_delivery=callback(fut),
                )
                futures.append(fut)
        except (KafkaException, BufferError) as exc:
            for fut in futures:
                fut.cancel()
            raise PublishFailed(f"produce: {exc}") from exc
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*futures, return_exceptions=True), self.timeout_s + 1.0
            )
        except TimeoutError as exc:
            raise PublishFailed("no broker acknowledgement in time") from exc
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise PublishFailed(f"delivery: {errors[0]}")
        self.published += len(records)

    def close(self, timeout: float = 5.0) -> None:
        self._producer.flush(timeout)
        self._stop.set()
        self._thread.join(2)


def _settle(fut: asyncio.Future[None], err: Any) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(KafkaException(err))
