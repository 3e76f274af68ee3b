"""Contracts against a real schema registry (Apicurio, Confluent API) and a real broker.

The registry is started only for this module (it takes a few seconds; every other test uses the
in-process mock:// registry), on the stack's PostgreSQL. Each test uses its own contract name,
so its own subject. No skip: this machine has a Java >= 21 (find_java looks under
/usr/lib/jvm), and without one these tests fail with the reason.
"""

from __future__ import annotations

import json
import os
import random
import string
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from flashsend.settings import Settings, settings_env
from infra.process import free_port
from infra.registry import SchemaRegistry, find_java
from producers.topics import ensure_topics
from schemas.contracts import check_offline, check_registry, register_all
from schemas.serde import AvroCodec, ContractNotRegistered, registry_client, schema_files
from tests.conftest import LocalStack

V1: dict[str, Any] = {
    "type": "record",
    "name": "Probe",
    "namespace": "flashsend.probe.v1",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "email", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}


def _registry_settings(stack: LocalStack, state_dir: Path) -> Settings:
    return stack.settings_for(
        state_dir=state_dir,
        registry_port=free_port(),
        registry_database=f"registry_{uuid.uuid4().hex[:8]}",
    )


# One worker runs this module: its module fixture is a process of its own.
pytestmark = pytest.mark.xdist_group("schema_registry")


@pytest.fixture(scope="module")
def registry(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = _registry_settings(stack, tmp_path_factory.mktemp("registry"))
    find_java(settings.registry_java)  # raises PrerequisiteMissing with the reason: no skip
    service = SchemaRegistry(settings)
    service.start()
    try:
        yield service.url
    finally:
        service.stop()


def _name() -> str:
    return "probe_" + "".join(random.choices(string.ascii_lowercase, k=10))


def _write(directory: Path, name: str, version: int, schema: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.v{version}.avsc").write_text(json.dumps(schema))


def _v2_added_optional() -> dict[str, Any]:
    v2 = json.loads(json.dumps(V1))
    v2["fields"].append({"name": "locale", "type": "string", "default": "en"})
    return v2


def _v2_removed_required() -> dict[str, Any]:
    v2 = json.loads(json.dumps(V1))
    v2["fields"] = [f for f in v2["fields"] if f["name"] != "email"]
    return v2


@pytest.mark.parametrize(
    ("role", "contract"),
    [("campaign", "campaign_recipient"), ("mail", "order_event"), ("feedback", "ses_event")],
)
def test_a_worker_outside_the_local_stack_stops_in_one_line_on_an_unregistered_contract(
    registry: str, settings: Settings, role: str, contract: str
) -> None:
    """Runs before any test registers the shipped contracts in this module's registry. The
    broker address answers nothing: the contracts are checked before any Kafka client exists,
    whose librdkafka would print its own lines to stderr."""
    s = settings.model_copy(
        update={
            "schema_registry_url": registry,
            "schema_auto_register": False,
            "kafka_bootstrap": f"127.0.0.1:{free_port()}",
        }
    )
    run = subprocess.run(
        [sys.executable, "-m", "flashsend.cli", "worker", "--role", role],
        env={**os.environ, **settings_env(s)},
        capture_output=True,
        text=True,
        timeout=90,
    )
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stderr[-2000:]
    assert f"{contract}.v" in lines[0] and "flashsend schemas register" in lines[0]
    assert f"flashsend.{contract}-value" not in registry_client(registry).get_subjects()


def test_added_optional_field_passes_removed_required_field_fails(
    registry: str, tmp_path: Path
) -> None:
    client = registry_client(registry)
    name = _name()
    released = tmp_path / "released"
    _write(released, name, 1, V1)
    register_all(client, "FULL", released)
    assert client.get_compatibility(f"flashsend.{name}-value") == "FULL"
    assert client.get_compatibility() == "BACKWARD"  # the registry's global rule

    good = tmp_path / "good"
    _write(good, name, 1, V1)
    _write(good, name, 2, _v2_added_optional())
    assert all(r.ok for r in check_registry(client, "FULL", good))
    assert all(r.ok for r in check_offline("FULL", good, git_rev=None))

    bad = tmp_path / "bad"
    _write(bad, name, 1, V1)
    _write(bad, name, 2, _v2_removed_required())
    online = check_registry(client, "FULL", bad)
    assert not online[0].ok
    assert any("rejects it" in p for p in online[0].problems)  # the registry's own verdict
    assert any(".email" in p for p in online[0].problems)  # and why
    offline = check_offline("FULL", bad, git_rev=None)
    assert [r.ok for r in offline] == [False]
    # The registry refuses to register it too: a producer cannot publish the broken contract.
    with pytest.raises(Exception, match=r"409|ncompatible"):
        register_all(client, "FULL", bad)


def test_shipped_contracts_register_and_check_clean(registry: str) -> None:
    client = registry_client(registry)
    done = register_all(client, "FULL")
    assert {d["subject"] for d in done} >= {"flashsend.campaign_recipient-value"}
    assert all(r.ok for r in check_registry(client, "FULL"))


def test_produce_v1_consume_v2_on_a_real_broker(
    registry: str, settings: Settings, tmp_path: Path
) -> None:
    client = registry_client(registry)
    name = _name()
    v1_dir, v2_dir = tmp_path / "v1", tmp_path / "v2"
    _write(v1_dir, name, 1, V1)
    _write(v2_dir, name, 1, V1)
    _write(v2_dir, name, 2, _v2_added_optional())
    register_all(client, "FULL", v1_dir)
    writer = AvroCodec(client, name, v1_dir)
    reader = AvroCodec(client, name, v2_dir, auto_register=True)
    assert writer.schema_id != reader.schema_id

    topic = f"probe-{uuid.uuid4().hex[:8]}"
    ensure_topics(settings.kafka_bootstrap, {topic: 1})
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    producer.produce(topic, value=writer.encode({"id": 7, "email": "a@b.c", "note": None}))
    producer.produce(topic, value=reader.encode({"id": 8, "email": "d@e.f", "note": "x"}))
    assert producer.flush(10) == 0
    records = _consume(settings, topic, 2)
    assert [reader.decode(v) for v in records] == [
        {"id": 7, "email": "a@b.c", "note": None, "locale": "en"},  # v1 record, v2 default
        {"id": 8, "email": "d@e.f", "note": "x", "locale": "en"},
    ]
    # ... and the previous reader still reads the new records (FULL: rolling deploys).
    assert writer.decode(records[1]) == {"id": 8, "email": "d@e.f", "note": "x"}


def test_codec_bytes_equal_confluent_serializer_both_ways(registry: str, tmp_path: Path) -> None:
    """Our fastavro codec and confluent-kafka's AvroSerializer/AvroDeserializer speak the same
    Confluent wire format against the real registry: same bytes out, each reads the other."""
    client = registry_client(registry)
    name = _name()
    _write(tmp_path, name, 1, V1)
    codec = AvroCodec(client, name, tmp_path, auto_register=True)
    subject = f"flashsend.{name}-value"
    serializer = AvroSerializer(
        SchemaRegistryClient({"url": registry}),
        json.dumps(V1),
        conf={
            "auto.register.schemas": False,
            "use.latest.version": True,
            "subject.name.strategy": lambda _ctx, _name: subject,
        },
    )
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry}))
    ctx = SerializationContext("any-topic", MessageField.VALUE)
    record = {"id": 42, "email": "lan@example.com", "note": "xin chào"}
    theirs = serializer(record, ctx)
    ours = codec.encode(record)
    assert theirs == ours
    assert theirs[0] == 0 and int.from_bytes(theirs[1:5], "big") == codec.schema_id
    assert codec.decode(theirs) == record
    assert deserializer(ours, ctx) == record


def test_a_codec_registers_only_when_allowed_and_at_the_configured_level(
    registry: str, tmp_path: Path
) -> None:
    client = registry_client(registry)
    name = _name()
    subject = f"flashsend.{name}-value"
    _write(tmp_path, name, 1, V1)
    expected = rf"{name}.v1.avsc .*{subject}.*schemas register"
    with pytest.raises(ContractNotRegistered, match=expected):
        AvroCodec(client, name, tmp_path)
    assert subject not in client.get_subjects()  # the failed start registered nothing
    allowed = AvroCodec(client, name, tmp_path, auto_register=True, compatibility="FULL")
    assert client.get_compatibility(subject) == "FULL"  # not the global BACKWARD
    assert AvroCodec(client, name, tmp_path).schema_id == allowed.schema_id  # found, not added
    assert client.get_versions(subject) == [1]


def test_workers_starting_together_on_a_fresh_registry_all_start(
    registry: str, tmp_path: Path
) -> None:
    """Apicurio answers 409 to all but one of concurrent first level rules on a subject (8
    threads: every round of 20 had some); each racer must start with the one schema id."""
    name = _name()
    subject = f"flashsend.{name}-value"
    _write(tmp_path, name, 1, V1)
    start = threading.Barrier(8)

    def worker(_: int) -> int:
        client = registry_client(registry)
        start.wait()
        return AvroCodec(client, name, tmp_path, auto_register=True).schema_id

    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(worker, range(8)))
    client = registry_client(registry)
    assert len(ids) == 1
    assert client.get_versions(subject) == [1]
    assert client.get_compatibility(subject) == "FULL"


def test_a_service_outside_the_local_stack_refuses_to_start_on_an_unregistered_contract(
    registry: str, settings: Settings, tmp_path: Path
) -> None:
    """`schema_auto_register` off (as for any non-loopback registry): the shipped contracts
    are not registered in this fresh subject namespace → the relay's codec fails in one line."""
    from schemas import serde

    s = settings.model_copy(update={"schema_registry_url": registry, "schema_auto_register": False})
    name = _name()
    _write(tmp_path, name, 1, V1)
    with pytest.raises(ContractNotRegistered):
        AvroCodec(registry_client(s.schema_registry_url), name, tmp_path)
    register_all(registry_client(registry), "FULL")
    assert serde.codec(s, "order_event").schema_id > 0  # registered by the deploy step: found


def test_schema_ids_survive_a_restart_of_the_registry(stack: LocalStack, tmp_path: Path) -> None:
    settings = _registry_settings(stack, tmp_path)
    service = SchemaRegistry(settings)
    service.start()
    try:
        ids = {d["file"]: d["id"] for d in register_all(registry_client(service.url), "FULL")}
    finally:
        service.stop()
    service.start()
    try:
        fresh = SchemaRegistryClient({"url": service.url})  # no client-side cache
        for f in schema_files():
            found = fresh.lookup_schema(f.subject, Schema(f.text(), "AVRO"))
            assert found.schema_id == ids[f.path.name], f.path.name
            stored = fresh.get_schema(ids[f.path.name]).schema_str or "null"
            assert json.loads(stored) == json.loads(f.text())
        assert fresh.get_compatibility("flashsend.order_event-value") == "FULL"
    finally:
        service.stop()


def _consume(settings: Settings, topic: str, expect: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"probe-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    out: list[bytes] = []
    try:
        for _ in range(60):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append(msg.value() or b"")
            if len(out) >= expect:
                break
    finally:
        consumer.close()
    return out
