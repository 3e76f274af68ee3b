"""The webhook's SNS endpoint with the PRODUCTION policy (AWS hosts, https, our TopicArn), fed
AWS's example SES bounce notification re-signed with a local key whose certificate is served
for the AWS-looking SigningCertURL. Each rejection answers 403 and produces nothing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from flashsend.lab.feedback_run import with_feedback
from flashsend.settings import Settings
from producers.mail_topics import ensure_mail_topics
from producers.sns_sign import build_subscription_confirmation, generate_signing_key, sign_message
from producers.sns_verify import StaticCertificateSource, VerifierPolicy
from tests.integration.feedback_helpers import (
    WebhookThread,
    codec,
    header,
    http,
    read_all,
    total_records,
)

FIXTURE = Path(__file__).parent.parent / "fixtures" / "sns" / "ses_bounce_notification.json"
TOPIC = "arn:aws:sns:us-east-1:123456789012:flashsend-ses-events"
CERT_URL = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0123456789abcdef.pem"
EXPIRED_URL = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-expired.pem"
EVIL_URL = "https://sns.us-east-1.amazonaws.com.evil.example/SimpleNotificationService-x.pem"
KEY, CERT = generate_signing_key()
OLD_KEY, OLD_CERT = generate_signing_key(now=datetime.now(UTC) - timedelta(days=3700))


@pytest.fixture
def webhook(settings: Settings) -> Iterator[WebhookThread]:
    s = with_feedback(settings)
    ensure_mail_topics(s)
    certs = StaticCertificateSource({CERT_URL: CERT, EXPIRED_URL: OLD_CERT, EVIL_URL: CERT})
    thread = WebhookThread(s, policy=VerifierPolicy(frozenset({TOPIC})), certificates=certs)
    yield thread
    thread.stop()


def fixture_fields(**overrides: str) -> dict[str, str]:
    """AWS's example envelope, unsigned, with a fresh MessageId (SNS's are unique)."""
    fields: dict[str, str] = json.loads(FIXTURE.read_text())
    for key in ("Signature", "SignatureVersion"):
        fields.pop(key)
    fields["MessageId"] = f"fixture-{threading.get_ident()}-{datetime.now(UTC).timestamp()}"
    fields["SigningCertURL"] = CERT_URL
    fields.update(overrides)
    return fields


def post(webhook: WebhookThread, envelope: dict[str, Any], kind: str | None = "") -> Any:
    headers = {"Content-Type": "text/plain; charset=UTF-8"}
    message_type = envelope.get("Type") if kind == "" else kind
    if message_type is not None:
        headers["x-amz-sns-message-type"] = str(message_type)
    return http("POST", webhook.url + "/sns", json.dumps(envelope).encode(), headers)


@pytest.mark.parametrize("version", [1, 2])
def test_valid_notification_is_published_once_keyed_by_recipient(
    webhook: WebhookThread, version: int
) -> None:
    s = webhook.settings
    envelope = sign_message(fixture_fields(), KEY, version)
    answer = post(webhook, envelope)
    assert (answer.status, answer.body) == (200, "ok")
    again = post(webhook, envelope)  # SNS retried: same MessageId
    assert (again.status, again.body) == (200, "duplicate")
    [msg] = read_all(s, s.topic_mail_events, expect=1)
    assert msg.key() == b"recipient@example.com"
    assert header(msg, "flashsend.schema") == "ses_event"
    record = codec(s, "ses_event").decode(msg.value())
    assert record["event_type"] == "Bounce" and record["bounce_type"] == "Permanent"
    assert (record["campaign_id"], record["seq"]) == (42, 7)
    assert record["sns_message_id"] == envelope["MessageId"]
    assert record["configuration_set"] == "flashsend-events"
    assert "ses:source-ip" not in record["tags"] and record["tags"]["campaign"] == "42"


def _recorder() -> tuple[ThreadingHTTPServer, list[str]]:
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, hits


def test_every_forgery_gets_403_and_nothing_is_produced(webhook: WebhookThread) -> None:
    s = webhook.settings
    before = total_records(s, s.topic_mail_events)
    signed = sign_message(fixture_fields(), KEY, 2)
    tampered = dict(signed, Message=signed["Message"].replace("Permanent", "Transient"))
    trap, hits = _recorder()
    evil_subscribe = f"http://127.0.0.1:{trap.server_address[1]}/?Action=ConfirmSubscription"
    confirmation = build_subscription_confirmation(
        TOPIC, evil_subscribe, "tok", CERT_URL, datetime.now(UTC)
    )
    cases: dict[str, tuple[dict[str, Any], str | None]] = {
        "tampered Message": (tampered, ""),
        "cert host not SNS": (sign_message(fixture_fields(SigningCertURL=EVIL_URL), KEY, 2), ""),
        "cert over http": (
            sign_message(fixture_fields(SigningCertURL=CERT_URL.replace("https", "http")), KEY, 1),
            "",
        ),
        "unexpected TopicArn": (
            sign_message(fixture_fields(TopicArn=TOPIC + "-other"), KEY, 2),
            "",
        ),
        "unknown Type": (sign_message(fixture_fields(Type="Announcement"), KEY, 2), ""),
        "expired certificate": (
            sign_message(fixture_fields(SigningCertURL=EXPIRED_URL), OLD_KEY, 2),
            "",
        ),
        "signed by another key": (sign_message(fixture_fields(), OLD_KEY, 2), ""),
        "no message-type header": (signed, None),
        "SubscribeURL off SNS": (sign_message(confirmation, KEY, 2), ""),
        "not an SNS envelope": ({"junk": "x"}, "Notification"),
    }
    try:
        for name, (envelope, kind) in cases.items():
            answer = post(webhook, envelope, kind)
            assert answer.status == 403, f"{name}: {answer.status} {answer.body}"
        assert hits == [], "the webhook fetched a SubscribeURL it should have refused"
    finally:
        trap.shutdown()
        trap.server_close()
    assert total_records(s, s.topic_mail_events) == before
    stats = webhook.runtime.sns.stats
    assert stats["notifications"] == 0 and stats["records"] == 0
    reasons = {k for k in stats if k.startswith("rejected:")}
    assert {"rejected:bad_signature", "rejected:cert_url_not_allowed"} <= reasons
    assert {"rejected:topic_not_allowed", "rejected:cert_expired"} <= reasons


def test_broker_down_answers_503_so_sns_retries(settings: Settings) -> None:
    from infra.process import free_port

    s = with_feedback(
        settings, kafka_bootstrap=f"127.0.0.1:{free_port()}", webhook_publish_timeout_s=1.0
    )
    certs = StaticCertificateSource({CERT_URL: CERT})
    webhook = WebhookThread(
        s,
        policy=VerifierPolicy(frozenset({TOPIC})),
        certificates=certs,
        relay=False,
        ensure_topics=False,
    )
    try:
        answer = post(webhook, sign_message(fixture_fields(), KEY, 2))
        assert answer.status == 503
    finally:
        webhook.stop()


def test_unreadable_event_from_our_topic_is_dead_lettered(webhook: WebhookThread) -> None:
    s = webhook.settings
    answer = post(webhook, sign_message(fixture_fields(Message="not an SES event"), KEY, 2))
    assert (answer.status, answer.body) == (200, "dead-lettered")
    [letter] = read_all(s, s.topic_dlq, expect=1)
    assert header(letter, "flashsend.reason") == "not_json"
    assert total_records(s, s.topic_mail_events) == 0


def test_sms_reply_is_published_keyed_by_number_and_a_bad_sms_event_dead_lettered(
    webhook: WebhookThread,
) -> None:
    s = webhook.settings
    reply = {
        "originationNumber": "+1 425 555 0182",
        "destinationNumber": "+12125550101",
        "messageKeyword": "STOP",
        "messageBody": "Stop",
        "inboundMessageId": "cae173d2-66b9-564c-8309-21f858e9fb84",
    }
    answer = post(webhook, sign_message(fixture_fields(Message=json.dumps(reply)), KEY, 2))
    assert (answer.status, answer.body) == (200, "ok")
    [msg] = read_all(s, s.topic_mail_events, expect=1)
    assert msg.key() == b"+14255550182"
    record = codec(s, "ses_event").decode(msg.value())
    assert (record["event_type"], record["source"]) == ("SmsInbound", "sms_two_way")
    assert record["ses_message_id"] == reply["inboundMessageId"]

    event = {"eventType": "TEXT_DELIVERED", "destinationPhoneNumber": "+14255550156"}
    answer = post(webhook, sign_message(fixture_fields(Message=json.dumps(event)), KEY, 2))
    assert (answer.status, answer.body) == (200, "dead-lettered")
    [letter] = read_all(s, s.topic_dlq, expect=1)
    assert header(letter, "flashsend.reason") == "no_message_id"
    assert total_records(s, s.topic_mail_events) == 1
