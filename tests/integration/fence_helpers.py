"""Helpers for the offset-fence tests (sinks/offsets.py): owners taking partitions, doorbells at
chosen offsets, a topic deleted and created again, and a TCP proxy that loses a COMMIT answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from flashsend.settings import Settings
from schemas.doorbell import DoorbellWriter
from schemas.serde import AvroCodec, registry_client
from sinks.offsets import Assignment
from tests.integration.campaign_helpers import Consumed


async def until(check: Callable[[], bool], within: float) -> bool:
    """Poll `check` every 50 ms; False if it is still false after `within` seconds."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def take(store: Any, partitions: list[int]) -> dict[int, int]:
    """This store's worker is assigned `partitions` (a new epoch, as on a rebalance)."""
    return dict(await store.offsets.take(Assignment.of(store.topic, partitions)))


def doorbells(
    settings: Settings, campaign_id: int, rows: list[tuple[int, int]], first_offset: int
) -> list[Consumed]:
    """One doorbell per (seq, user_id) row on partition 0, at first_offset, first_offset + 1…"""
    codec = AvroCodec(registry_client(settings.schema_registry_url), "campaign_recipient")
    writer = DoorbellWriter(codec, campaign_id, 0)
    return [
        Consumed(
            settings.topic_recipients,
            0,
            first_offset + i,
            str(user_id).encode(),
            writer.encode([(seq, user_id)]),
        )
        for i, (seq, user_id) in enumerate(rows)
    ]


def stored_offsets(settings: Settings, group_id: str, topic: str) -> dict[int, int]:
    with psycopg.connect(settings.pg_dsn) as conn:
        return dict(
            conn.execute(
                "SELECT partition, next_offset FROM kafka_offsets WHERE group_id = %s "
                "AND topic = %s",
                (group_id, topic),
            ).fetchall()
        )


def recreate_topic(
    settings: Settings, topic: str, partitions: int, create: Callable[[], None] | None = None
) -> None:
    """Delete the topic and create it again under its name (Kafka deletes asynchronously),
    with `create` when given (the application's own topic creation)."""
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=30)
    deadline = time.monotonic() + 60
    while True:
        try:
            if create is None:
                admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)
            else:
                while topic in admin.list_topics(timeout=10).topics:
                    assert time.monotonic() < deadline
                    time.sleep(0.5)
                create()
            break
        except Exception:  # still being deleted
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    while len(admin.list_topics(topic, timeout=10).topics[topic].partitions) != partitions:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def log_ends(settings: Settings, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "fence-ends"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in meta.partitions
        }
    finally:
        consumer.close()


COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"  # the simple-protocol COMMIT psycopg sends


class CommitCutter:
    """A TCP proxy between psycopg and PostgreSQL. Armed, it cuts the first connection that
    sends COMMIT:
    - "after": forwards the COMMIT, waits for the server's answer, drops it and closes both
      sides: the transaction committed, the client never hears so;
    - "before": closes both sides without forwarding it: the server aborts;
    - "half_open": closes the client side only and keeps the server's connection open and
      silent: the server holds the transaction open, neither committed nor aborted."""

    def __init__(self, dsn: str) -> None:
        params = conninfo_to_dict(dsn)
        self.target = (str(params.get("host", "127.0.0.1")), int(params.get("port", 5432)))
        self.dsn = dsn
        self.mode: str | None = None
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self._held: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        """Start listening; returns the DSN that goes through the proxy."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return make_conninfo(self.dsn, host="127.0.0.1", port=port)

    def arm(self, mode: str) -> None:
        self.mode = mode

    async def stop(self) -> None:
        for writer in self._held:
            writer.close()
        if self._server is not None:
            self._server.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)
        answered = asyncio.Event()
        muted = asyncio.Event()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                if self.mode is not None and COMMIT in data:
                    mode, self.mode = self.mode, None
                    self.cuts += 1
                    if mode == "after":
                        muted.set()
                        answered.clear()
                        server_w.write(data)
                        await server_w.drain()
                        await asyncio.wait_for(answered.wait(), 10)
                    elif mode == "half_open":
                        self._held.append(server_w)
                    return
                server_w.write(data)
                await server_w.drain()

        async def downstream() -> None:
            while data := await server_r.read(65536):
                answered.set()
                if not muted.is_set():
                    client_w.write(data)
                    await client_w.drain()

        tasks = {asyncio.create_task(upstream()), asyncio.create_task(downstream())}
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            client_w.close()
            if server_w not in self._held:
                server_w.close()
