"""The webhook's Firehose endpoint on the real app, broker and dead-letter topic: a batch of SES
events lands on mail.events, its unreadable records on the DLQ with their reasons, and a
request that is refused or retried produces nothing more."""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import Iterator

import pytest
from pydantic import SecretStr

from flashsend.lab.feedback_run import with_feedback
from flashsend.lab.sqs_bench import ses_event_bodies
from flashsend.settings import Settings
from producers.firehose_endpoint import request_body, request_headers
from producers.mail_topics import ensure_mail_topics
from tests.integration.feedback_helpers import (
    Answer,
    WebhookThread,
    codec,
    header,
    http,
    read_all,
    total_records,
)

KEY, NEXT_KEY = "fh-key-current", "fh-key-next"


@pytest.fixture
def webhook(settings: Settings) -> Iterator[WebhookThread]:
    s = with_feedback(settings, firehose_access_keys=SecretStr(f"{KEY}, {NEXT_KEY}"))
    ensure_mail_topics(s)
    thread = WebhookThread(s, relay=False)
    yield thread
    thread.stop()


def post(
    webhook: WebhookThread, datas: list[bytes], *, key: str = KEY, rid: str = "", gz: bool = False
) -> tuple[str, Answer]:
    rid = rid or str(uuid.uuid4())
    body = request_body(rid, datas)
    headers = dict(request_headers(rid, key, gzip=gz))
    return rid, http(
        "POST", webhook.url + "/firehose", gzip.compress(body) if gz else body, headers
    )


def test_a_batch_lands_on_mail_events_and_its_bad_records_on_the_dlq(
    webhook: WebhookThread,
) -> None:
    s = webhook.settings
    events = [e.encode() + b"\n" for e in ses_event_bodies(40, campaign=42)]
    not_ses = b'{"hello": "world"}\n'
    rid = str(uuid.uuid4())
    body = json.loads(request_body(rid, [*events[:20], not_ses, *events[20:]]))
    body["records"].insert(5, {"data": "%%% not base64 %%%"})
    headers = dict(request_headers(rid, KEY))
    answer = http("POST", webhook.url + "/firehose", json.dumps(body).encode(), headers)
    assert answer.status == 200, answer.body
    assert json.loads(answer.body)["requestId"] == rid
    landed = read_all(s, s.topic_mail_events, expect=40)
    assert len(landed) == 40
    decoded = [codec(s, "ses_event").decode(m.value()) for m in landed]
    assert {r["campaign_id"] for r in decoded} == {42}
    assert all(r["sns_message_id"].startswith(f"firehose:{rid}:") for r in decoded)
    assert all(m.key() == r["recipient"].encode() for m, r in zip(landed, decoded, strict=True))
    letters = read_all(s, s.topic_dlq, expect=2)
    assert sorted(str(header(m, "flashsend.reason")) for m in letters) == [
        "bad_base64",
        "no_event_type",
    ]

    # Firehose retries a request it did not see acknowledged: same id, nothing produced again.
    again = http("POST", webhook.url + "/firehose", json.dumps(body).encode(), headers)
    assert again.status == 200 and json.loads(again.body)["requestId"] == rid
    assert total_records(s, s.topic_mail_events) == 40
    assert total_records(s, s.topic_dlq) == 2


def test_gzip_bodies_and_the_next_key_of_a_rotation_are_taken(webhook: WebhookThread) -> None:
    s = webhook.settings
    events = [e.encode() for e in ses_event_bodies(10)]
    _rid, answer = post(webhook, events, key=NEXT_KEY, gz=True)
    assert answer.status == 200, answer.body
    assert len(read_all(s, s.topic_mail_events, expect=10)) == 10


@pytest.mark.parametrize(
    ("key", "body", "status"),
    [
        ("", None, 401),
        ("not-our-key", None, 401),
        (KEY, b"not json", 400),
        (KEY, b'{"requestId": "x"}', 400),
        (KEY, b'{"records": []}', 400),
    ],
)
def test_a_refused_request_produces_nothing(
    webhook: WebhookThread, key: str, body: bytes | None, status: int
) -> None:
    s = webhook.settings
    rid = str(uuid.uuid4())
    data = body if body is not None else request_body(rid, [ses_event_bodies(1)[0].encode()])
    answer = http("POST", webhook.url + "/firehose", data, dict(request_headers(rid, key)))
    assert answer.status == status, answer.body
    assert "errorMessage" in json.loads(answer.body)
    assert total_records(s, s.topic_mail_events) == 0
    assert total_records(s, s.topic_dlq) == 0


def test_no_key_configured_refuses_everything(settings: Settings) -> None:
    s = with_feedback(settings, firehose_access_keys=SecretStr(""))
    ensure_mail_topics(s)
    webhook = WebhookThread(s, relay=False)
    try:
        _rid, answer = post(webhook, [ses_event_bodies(1)[0].encode()])
        assert answer.status == 401
        assert "FLASHSEND_FIREHOSE_ACCESS_KEYS" in json.loads(answer.body)["errorMessage"]
        assert total_records(s, s.topic_mail_events) == 0
    finally:
        webhook.stop()


def test_broker_down_answers_503_so_firehose_retries(settings: Settings) -> None:
    from infra.process import free_port

    s = with_feedback(
        settings,
        kafka_bootstrap=f"127.0.0.1:{free_port()}",
        webhook_publish_timeout_s=1.0,
        firehose_access_keys=SecretStr(KEY),
    )
    webhook = WebhookThread(s, relay=False, ensure_topics=False)
    try:
        rid, answer = post(webhook, [e.encode() for e in ses_event_bodies(5)])
        assert answer.status == 503
        assert json.loads(answer.body)["requestId"] == rid
    finally:
        webhook.stop()
