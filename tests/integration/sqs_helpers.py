"""A real SQS server (ElasticMQ) for the tests of the SQS ingest path, started once per
session beside the session's stack, and settings that use it with a queue of their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flashsend.settings import Settings
from flashsend.sqs_run import with_sqs
from infra.elasticmq import ElasticMq
from infra.process import free_port
from tests.conftest import LocalStack


@pytest.fixture(scope="session")
def sqs_server(stack: LocalStack) -> Iterator[Settings]:
    port = free_port()
    settings = stack.settings_for(sqs_port=port, sqs_endpoint=f"http://127.0.0.1:{port}")
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
    return with_sqs(
        settings,
        sqs_port=sqs_server.sqs_port,
        sqs_endpoint=sqs_server.sqs_endpoint,
        events_visibility_s=15,
    )
