"""The SQS ingest path's pure parts: what the puller reads from a message body, and what the
SES stand-in puts in the queue."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from infra.ses_standin.sqs_sink import batches_for, parse_subscription
from producers.ses_events import SesEventInvalid, parse_ses_message
from producers.ses_records import out_records
from producers.sqs_client import SqsMessage
from producers.sqs_puller import backoff_s, read_message
from schemas.serde import AvroCodec, registry_client

ENVELOPE = Path(__file__).parent.parent / "fixtures" / "sns" / "ses_bounce_notification.json"


def message(body: str, message_id: str = "m-1") -> SqsMessage:
    return SqsMessage(message_id, "receipt-1", body, receive_count=1, sent_at_ms=None)


def raw_event() -> str:
    """The SES event JSON as SQS holds it with raw message delivery: SNS's `Message` field."""
    return str(json.loads(ENVELOPE.read_text())["Message"])


def test_a_raw_body_gives_the_records_the_webhook_gives_for_the_same_event() -> None:
    [record] = read_message(message(raw_event(), "sqs-77"), received_at_ms=5)
    [webhook] = parse_ses_message(raw_event(), sns_message_id="sns-9", received_at_ms=5)
    assert record == {**webhook, "sns_message_id": "sqs:sqs-77"}
    codec = AvroCodec(registry_client("mock://unit"), "ses_event")
    [ours], [theirs] = out_records([record], codec), out_records([webhook], codec)
    assert (ours.key, ours.headers) == (theirs.key, theirs.headers)


def test_an_sns_envelope_means_raw_delivery_is_off() -> None:
    with pytest.raises(SesEventInvalid) as caught:
        read_message(message(ENVELOPE.read_text()), received_at_ms=5)
    assert caught.value.reason == "not_raw_delivery"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("not json", "not_json"),
        ("[1, 2]", "not_an_object"),
        ('{"eventType": "Bounce"}', "no_mail"),
        ('{"hello": "world"}', "no_event_type"),
    ],
)
def test_poison_is_named(body: str, reason: str) -> None:
    with pytest.raises(SesEventInvalid) as caught:
        read_message(message(body), received_at_ms=5)
    assert caught.value.reason == reason


def test_backoff_grows_to_its_cap_with_jitter() -> None:
    rng = random.Random(1)
    assert 0.25 <= backoff_s(0, 30, rng) <= 0.5
    assert 2.0 <= backoff_s(3, 30, rng) <= 4.0
    assert all(15 <= backoff_s(n, 30, rng) <= 30 for n in range(6, 40))


def accepted(destination: list[str], configuration_set: str = "marketing") -> dict[str, Any]:
    return {
        "message_id": "0100-abc",
        "time": 1_800_000_000.0,
        "from": "Sale <sale@news.flashsend.test>",
        "destination": destination,
        "subject": "Flash sale",
        "configuration_set": configuration_set,
        "tags": {"campaign": "42", "seq": "7"},
        "operation": "bulk",
    }


def test_the_stand_in_puts_raw_ses_events_in_each_subscribed_queue_filtered_by_type() -> None:
    subs = {
        "all": {"id": "all", "queue_url": "http://q/1/a", "event_types": None},
        "bounces": {"id": "bounces", "queue_url": "http://q/1/b", "event_types": ["Bounce"]},
    }
    item = {
        "record": accepted(["a@x.test", "b@x.test"]),
        "plan": [["a@x.test", "bounce"], ["b@x.test", "delivered"]],
        "rejected": False,
        "subs": ["all", "bounces", "gone"],
    }
    out = batches_for(subs, item, now=datetime(2027, 1, 1, tzinfo=UTC), region="us-east-1")
    types = {k: [json.loads(b)["eventType"] for b in v] for k, v in out.items()}
    assert types == {"all": ["Send", "Bounce", "Delivery"], "bounces": ["Bounce"]}
    [bounce] = parse_ses_message(out["bounces"][0], sns_message_id="x", received_at_ms=1)
    assert (bounce["recipient"], bounce["bounce_type"]) == ("a@x.test", "Permanent")
    assert (bounce["campaign_id"], bounce["seq"], bounce["configuration_set"]) == (
        42,
        7,
        "marketing",
    )


def test_sqs_subscriptions_are_validated() -> None:
    ok = parse_subscription(
        {"queue_url": "http://127.0.0.1:9324/000000000000/q", "topic_arn": "arn:aws:sns:x:1:t"}
    )
    assert ok["configuration_sets"] is None and ok["event_types"] is None
    for bad, why in [
        ({"topic_arn": "arn:aws:sns:x:1:t"}, "queue_url"),
        ({"queue_url": "http://h/q", "topic_arn": "t"}, "topic_arn"),
        (
            {"queue_url": "http://h/q", "topic_arn": "arn:aws:sns:x:1:t", "event_types": ["Open"]},
            "event_types",
        ),
        (
            {
                "queue_url": "http://h/q",
                "topic_arn": "arn:aws:sns:x:1:t",
                "raw_message_delivery": False,
            },
            "raw",
        ),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_subscription(bad)


@pytest.mark.parametrize("token", [None, "session-token"])
def test_sigv4_headers_are_what_botocore_signs(token: str | None) -> None:
    """botocore's own SigV4 signer is the reference: same request, same instant, same
    Authorization header."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from producers.sqs_client import CONTENT_TYPE, sigv4_headers

    creds = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    body = b'{"QueueUrl":"https://sqs.eu-west-1.amazonaws.com/123456789012/q","MaxNumberOfMessages":10}'
    request = AWSRequest(
        "POST",
        "https://sqs.eu-west-1.amazonaws.com/",
        data=body,
        headers={"Content-Type": CONTENT_TYPE, "X-Amz-Target": "AmazonSQS.ReceiveMessage"},
    )
    SigV4Auth(creds.get_frozen_credentials(), "sqs", "eu-west-1").add_auth(request)
    keys: dict[tuple[str, str, str], bytes] = {}
    for _ in range(2):  # the second from the cached signing key
        ours = sigv4_headers(
            host="sqs.eu-west-1.amazonaws.com",
            path="/",
            body=body,
            target="AmazonSQS.ReceiveMessage",
            region="eu-west-1",
            credentials=creds.get_frozen_credentials(),
            amz_date=request.headers["X-Amz-Date"],
            keys=keys,
        )
        assert ours["Authorization"] == request.headers["Authorization"]
        assert ours.get("X-Amz-Security-Token") == token
    assert len(keys) == 1
