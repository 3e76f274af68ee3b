"""Helpers for the deliverability tests: the webhook in a thread, plain HTTP, topic reads,
Delivery events of a campaign produced to mail.events and counted once applied."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import psycopg
from confluent_kafka import Consumer, Message, Producer

from flashsend.lab.feedback_run import end_offsets
from flashsend.settings import Settings
from producers.ses_events import event_id
from producers.webhook import WebhookRuntime, serve
from schemas.serde import AvroCodec, registry_client
from streams.feedback_ingest import SCHEMA_HEADER
from tests.integration.campaign_helpers import Consumed


class WebhookThread:
    """Our webhook (the real app and runtime) served from a thread of the test process, so a
    test can inject a certificate source for AWS-looking URLs."""

    def __init__(self, settings: Settings, **runtime_args: Any) -> None:
        self.settings = settings
        self.runtime = WebhookRuntime(settings, **runtime_args)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="webhook", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError(f"webhook not started: {self._error}")

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            task = asyncio.create_task(serve(self.runtime, "127.0.0.1", self.port, self._stop))
            while not task.done():
                if _port_answers(self.port):
                    self._ready.set()
                    break
                await asyncio.sleep(0.02)
            await task

        try:
            asyncio.run(main())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    @property
    def port(self) -> int:
        return self.settings.webhook_port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def _port_answers(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Answer:
    def __init__(self, status: int, body: str, headers: dict[str, str]) -> None:
        self.status, self.body, self.headers = status, body, headers


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def http(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> Answer:
    """One request, no cookie jar, redirects not followed (a 3xx comes back as is)."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=30) as response:
            return Answer(response.status, response.read().decode(), dict(response.headers))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.read().decode(), dict(exc.headers))


def total_records(settings: Settings, topic: str) -> int:
    return sum(end_offsets(settings, topic).values())


def read_all(settings: Settings, topic: str, expect: int, timeout: float = 20.0) -> list[Message]:
    """Every record of `topic` from the start (at least `expect`, then a short idle wait)."""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    found: list[Message] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.3)
            if msg is not None and msg.error() is None:
                found.append(msg)
            elif len(found) >= expect:
                break
    finally:
        consumer.close()
    return found


def header(msg: Message, name: str) -> str | None:
    for key, value in msg.headers() or []:
        if key == name and isinstance(value, bytes):
            return value.decode()
    return None


def codec(settings: Settings, name: str) -> AvroCodec:
    return AvroCodec(registry_client(settings.schema_registry_url), name)


def done_campaign(settings: Settings) -> int:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO campaigns (name, template, from_address, audience_condition, status) "
            "VALUES ('t', 't', 'a@b.test', 'true', 'done') RETURNING id"
        ).fetchone()
    assert row is not None
    return int(row[0])


def deliveries(
    settings: Settings, campaign_id: int, count: int, first_offset: int
) -> list[Consumed]:
    """`count` Delivery events of the campaign on partition 0, from `first_offset` on."""
    ses = codec(settings, "ses_event")
    records = []
    for i in range(count):
        to = f"d-{uuid.uuid4().hex[:12]}@x.test"
        message_id = f"ses-{uuid.uuid4()}"
        value = ses.encode(
            {
                "event_id": event_id(message_id, "Delivery", to),
                "event_type": "Delivery",
                "version": 1,
                "occurred_at": 0,
                "recipient": to,
                "ses_message_id": message_id,
                "sns_message_id": str(uuid.uuid4()),
                "campaign_id": campaign_id,
                "seq": None,
                "configuration_set": "marketing",
                "tags": {},
                "bounce_type": None,
                "bounce_sub_type": None,
                "complaint_type": None,
                "detail": None,
                "source": "event_publishing",
                "received_at": 0,
            }
        )
        records.append(
            Consumed(
                settings.topic_mail_events,
                0,
                first_offset + i,
                to.encode(),
                value,
                ((SCHEMA_HEADER, b"ses_event"),),
            )
        )
    return records


def delivered(settings: Settings, campaign_id: int) -> int:
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(delivered), 0) FROM campaign_feedback WHERE campaign_id = %s",
            (campaign_id,),
        ).fetchone()
    return int(row[0]) if row else 0


def produce_events(settings: Settings, records: list[Consumed]) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "acks": "all"})
    for r in records:
        producer.produce(
            settings.topic_mail_events,
            key=r.key,
            value=r.value,
            partition=0,
            headers=list(r.headers),
        )
    assert producer.flush(30) == 0
