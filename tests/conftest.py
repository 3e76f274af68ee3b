"""Shared fixtures: one real stack per test session, one database and topic set per test.

The stack (Kafka broker, PostgreSQL 18, SES stand-in) is started once in a temp state dir on
free loopback ports, or reused when FLASHSEND_TEST_REUSE_STACK=1 and FLASHSEND_* point at a
running one (e.g. after `flashsend up`).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from flashsend.settings import Settings, load_settings
from infra.kafka import KafkaCluster
from infra.migrate import apply_migrations
from infra.postgres import PostgresServer
from infra.process import free_port
from infra.stack import SesStandin

TEMPLATE_DB = "flashsend_test_template"


@dataclass
class LocalStack:
    settings: Settings
    kafka: KafkaCluster
    postgres: PostgresServer
    ses: SesStandin
    owned: bool

    def settings_for(self, **overrides: object) -> Settings:
        data = self.settings.model_dump()
        data.update(overrides)
        return Settings(**data)


def _start_stack(state_dir: Path) -> LocalStack:
    if os.environ.get("FLASHSEND_TEST_REUSE_STACK") == "1":
        settings = load_settings()
        return LocalStack(
            settings,
            KafkaCluster(settings),
            PostgresServer(settings),
            SesStandin(settings),
            owned=False,
        )
    settings = load_settings(
        state_dir=state_dir,
        kafka_port=free_port(),
        kafka_controller_port=free_port(),
        pg_port=free_port(),
        ses_port=free_port(),
        kafka_heap_mb=384,
        ses_max_send_rate=0,
        # The real registry (Apicurio) is started only by the tests that need it.
        schema_registry_url="mock://flashsend",
    )
    stack = LocalStack(
        settings, KafkaCluster(settings), PostgresServer(settings), SesStandin(settings), owned=True
    )
    stack.postgres.start()
    stack.kafka.start()
    stack.ses.start()
    return stack


@pytest.fixture(scope="session")
def stack(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    # Not under pytest's basetemp: every pytest session that starts on the machine makes
    # /tmp/pytest-of-<user> private again (mode 0700), and run as root, PostgreSQL's own user
    # could then no longer reach its data dir: a test's restart of PostgreSQL would fail.
    state_dir = Path(tempfile.mkdtemp(prefix="flashsend-test-stack-"))
    test_stack = _start_stack(state_dir)
    test_stack.postgres.create_database(TEMPLATE_DB)
    apply_migrations(test_stack.settings.pg_dsn_for(TEMPLATE_DB))
    try:
        yield test_stack
    finally:
        if test_stack.owned:  # its state dir is deleted below: nothing to shut down cleanly
            test_stack.ses.stop()
            test_stack.kafka.stop(discard=True)
            test_stack.postgres.stop(mode="immediate")
        if request.session.testsfailed:
            print(f"\ntest stack's state dir (logs) kept: {state_dir}")
        else:
            shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture
def settings(stack: LocalStack) -> Settings:
    """Settings for one test: its own database (cloned from the migrated template) and topics."""
    suffix = uuid.uuid4().hex[:10]
    database = f"t_{suffix}"
    stack.postgres.create_database(database, template=TEMPLATE_DB)
    # Campaign ids are SES tags, and the stand-in is shared by every test of the session:
    # start each test database's ids at a random offset so its statistics never mix.
    with psycopg.connect(stack.settings.pg_dsn_for(database), autocommit=True) as conn:
        start = random.randrange(10**6, 10**9)
        conn.execute(f"ALTER SEQUENCE campaigns_id_seq RESTART WITH {start}")
    return stack.settings_for(
        pg_database=database,
        pg_dsn=stack.settings.pg_dsn_for(database),
        topic_recipients=f"recipients-{suffix}",
        topic_mail_events=f"events-{suffix}",
        topic_order_events=f"orders-{suffix}",
        topic_dlq=f"dlq-{suffix}",
        group_sender=f"sender-{suffix}",
        # Quiet hours depend on the hour the suite runs; their own tests set them.
        sms_send_hours="",
        app_id=f"flashsend-{suffix}",
    )


@pytest.fixture(scope="session")
def sqs_server(stack: LocalStack) -> Iterator[Settings]:
    """A real SQS server (ElasticMQ) beside the session's stack, for the SQS ingest path's
    tests only (defined here, once: a session fixture imported into several modules would
    be set up once per module)."""
    from infra.elasticmq import ElasticMq

    port = free_port()
    # In memory: about half the server's CPU per message; nothing here restarts it.
    settings = stack.settings_for(
        sqs_port=port, sqs_endpoint=f"http://127.0.0.1:{port}", sqs_persist=False
    )
    server = ElasticMq(settings)
    server.start()
    try:
        yield settings
    finally:
        server.stop()


@pytest.fixture
def sqs_settings(settings: Settings, sqs_server: Settings) -> Settings:
    """The test's settings (own database and topics) on the SQS server, with its own queue,
    SNS topic, webhook port and configuration sets."""
    from flashsend.lab.sqs_run import with_sqs

    return with_sqs(
        settings,
        sqs_port=sqs_server.sqs_port,
        sqs_endpoint=sqs_server.sqs_endpoint,
        events_visibility_s=15,
        # Fixed here, whatever the default: the tests count a Send and a Delivery per mail.
        ses_event_types=(
            "Send",
            "Delivery",
            "Bounce",
            "Complaint",
            "Reject",
            "DeliveryDelay",
            "Rendering Failure",
        ),
    )
