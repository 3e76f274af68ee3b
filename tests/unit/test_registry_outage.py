"""A schema registry that does not answer is waited out, never taken for poison.

The registry here is a few lines of HTTP speaking the two Confluent API calls a consumer makes
(register its own schema at start, look a writer schema up by id): it stands for an external
service whose outage we need to switch on and off. Naive version caught: every lookup error
became SerdeError('unknown_schema_id'), so a registry restart dead-lettered good records.
"""

from __future__ import annotations

import asyncio
import json
import random
import struct
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from producers.dlq import DeadLetter
from schemas.serde import AvroCodec, latest, registry_client, wait_for_writer_schemas
from streams.mail_ingest import parse_record
from streams.rules.mail_logic import CreateMail

WRITER_ID = 7  # served once the registry is back
MISSING_ID = 8  # the registry answers 404: this id does not exist


@dataclass
class Registry:
    down_for: int = 0  # lookups answered 503 before the registry is back
    lookups: list[int] = field(default_factory=list)


@pytest.fixture
def registry() -> Iterator[tuple[Registry, str]]:
    state = Registry()
    schema_text = latest("order_event").text()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # register: our own schema gets id 1
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self._answer(200, {"id": 1})

        def do_GET(self) -> None:  # /schemas/ids/<id>
            schema_id = int(self.path.split("?")[0].rsplit("/", 1)[-1])
            state.lookups.append(schema_id)
            if state.down_for > 0:
                state.down_for -= 1
                self._answer(503, {"error_code": 50301, "message": "restarting"})
            elif schema_id == WRITER_ID:
                self._answer(200, {"schema": schema_text})
            else:
                self._answer(404, {"error_code": 40403, "message": "Schema not found"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@dataclass(frozen=True)
class Rec:
    value: bytes | None
    topic: str = "order.events"
    partition: int = 0
    offset: int = 0
    key: bytes | None = b"1"
    headers: tuple[tuple[str, bytes], ...] = ()


def written_with(schema_id: int) -> bytes:
    """A valid order event, as a producer whose registry gave `schema_id` wrote it."""
    import time

    body = AvroCodec(registry_client("mock://outage"), "order_event").encode(
        {
            "event_id": str(uuid.uuid4()),
            "event_type": "OrderConfirmed",
            "version": 1,
            "occurred_at": int(time.time() * 1000),
            "dedupe_key": "order-confirmed:1",
            "order_id": 1,
            "email": "lan@example.com",
        }
    )
    return struct.pack(">bI", 0, schema_id) + body[5:]


def parse(codec: AvroCodec, value: bytes) -> object:
    import time

    return parse_record(
        codec,
        Rec(value),
        now_ms=int(time.time() * 1000),
        max_age_s=86_400,
        at_most_once_templates=(),
    )


def test_registry_outage_is_waited_out_and_the_record_is_processed(
    registry: tuple[Registry, str],
) -> None:
    state, url = registry
    codec = AvroCodec(SchemaRegistryClient({"url": url, "max.retries": 0}), "order_event")
    state.down_for = 4
    value = written_with(WRITER_ID)
    retries = asyncio.run(
        wait_for_writer_schemas([codec], [value], cap_s=0.05, rng=random.Random(1))
    )
    assert retries >= 1 and state.down_for == 0
    assert isinstance(parse(codec, value), CreateMail)


def test_an_id_the_registry_does_not_have_is_poison_and_asked_once(
    registry: tuple[Registry, str],
) -> None:
    state, url = registry
    codec = AvroCodec(SchemaRegistryClient({"url": url, "max.retries": 0}), "order_event")
    values = [written_with(MISSING_ID), written_with(MISSING_ID)]
    assert asyncio.run(wait_for_writer_schemas([codec], list(values), cap_s=0.05)) == 0
    letters = [parse(codec, v) for v in values]
    assert all(isinstance(d, DeadLetter) and d.reason == "unknown_schema_id" for d in letters)
    assert state.lookups.count(MISSING_ID) == 1  # the answer is cached: no lookup per record
