"""The real services answer: broker round trips with both Kafka clients, migrations, stack CLI."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from flashsend.settings import Settings, load_settings
from infra.kafka import KafkaCluster
from infra.migrate import apply_migrations
from infra.process import free_port
from tests.conftest import LocalStack


def _create_topic(settings: Settings, name: str, partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(timeout=30)


def test_confluent_kafka_round_trip(settings: Settings) -> None:
    topic = settings.topic_recipients
    _create_topic(settings, topic)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True})
    delivered: list[str] = []
    for i in range(10):
        producer.produce(
            topic,
            key=str(i),
            value=f"v{i}",
            on_delivery=lambda err, msg: delivered.append("ok" if err is None else str(err)),
        )
    assert producer.flush(30) == 0
    assert delivered == ["ok"] * 10
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": settings.group_sender,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    seen: set[bytes] = set()
    try:
        while len(seen) < 10:
            msg = consumer.poll(10)
            assert msg is not None, "no record within 10 s"
            assert msg.error() is None
            seen.add(msg.value())
    finally:
        consumer.close()
    assert seen == {f"v{i}".encode() for i in range(10)}


def test_aiokafka_round_trip(settings: Settings) -> None:
    """aiokafka is the client Faust uses; it must speak to a Kafka 4 broker."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = settings.topic_mail_events
    _create_topic(settings, topic, partitions=1)

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
        await producer.start()
        try:
            for i in range(5):
                await producer.send_and_wait(topic, f"a{i}".encode())
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=settings.kafka_bootstrap,
            group_id=settings.group_sender,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            got: list[bytes] = []
            while len(got) < 5:
                batch = await consumer.getmany(timeout_ms=10_000)
                assert batch, "no record within 10 s"
                got.extend(m.value for msgs in batch.values() for m in msgs if m.value)
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == [f"a{i}".encode() for i in range(5)]


def test_migrations_apply_twice_cleanly(stack: LocalStack) -> None:
    database = f"m_{uuid.uuid4().hex[:8]}"
    stack.postgres.create_database(database)
    dsn = stack.settings.pg_dsn_for(database)
    first = apply_migrations(dsn)
    second = apply_migrations(dsn)
    assert first and second == []
    with psycopg.connect(dsn) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY 1")]
        assert versions == [m.version for m in first]
        server_version = conn.execute("SHOW server_version").fetchone()
        assert server_version is not None and server_version[0].startswith("18.")


def test_status_stack_reports_running_services(stack: LocalStack) -> None:
    env_vars = {
        "FLASHSEND_STATE_DIR": str(stack.settings.state_dir),
        "FLASHSEND_KAFKA_PORT": str(stack.settings.kafka_port),
        "FLASHSEND_PG_PORT": str(stack.settings.pg_port),
        "FLASHSEND_SES_PORT": str(stack.settings.ses_port),
        # The test stack runs no schema registry (only test_schema_registry.py starts one).
        "FLASHSEND_LOCAL_SERVICES": '["kafka", "postgres", "ses"]',
    }
    import os

    out = subprocess.run(
        [sys.executable, "-m", "flashsend.cli", "status-stack", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **env_vars},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert '"up": false' not in out.stdout


def test_port_taken_gives_one_line(stack: LocalStack) -> None:
    """A second `up` on a taken port refuses with one line, and leaves nothing running."""
    import os

    env_vars = {
        "FLASHSEND_STATE_DIR": str(stack.settings.state_dir) + "-other",
        "FLASHSEND_PG_PORT": str(stack.settings.pg_port),  # taken by the test stack
    }
    out = subprocess.run(
        [sys.executable, "-m", "flashsend.cli", "up"],
        capture_output=True,
        text=True,
        env={**os.environ, **env_vars},
        timeout=120,
    )
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()
    assert len(last) == 1 and "FLASHSEND_PG_PORT" in last[0], out.stderr


def test_a_broker_in_a_small_heap_starts_and_serves(tmp_path: Path) -> None:
    """The log cleaner's buffer follows the heap: a node given 128 MiB starts and creates a
    topic. Kafka's default buffer (128 MiB, allocated at start) cannot fit such a heap: the
    node exits with OutOfMemoryError, as a 256-MiB node of the test clusters does now and
    then."""
    settings = load_settings(
        state_dir=tmp_path,
        kafka_port=free_port(),
        kafka_controller_port=free_port(),
        kafka_heap_mb=128,
        local_services=("kafka",),
    )
    kafka = KafkaCluster(settings)
    try:
        kafka.start(timeout=60)
        _create_topic(settings, f"small-heap-{uuid.uuid4().hex[:8]}")
    finally:
        kafka.stop()
