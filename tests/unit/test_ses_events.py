"""SES event JSON → one record per recipient (pure), starting from AWS's published example."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from producers.ses_events import (
    EVENT_NAMESPACE,
    SesEventInvalid,
    event_id,
    parse_ses_message,
    parse_timestamp_ms,
)
from schemas.serde import AvroCodec, registry_client

FIXTURE = Path(__file__).parent.parent / "fixtures" / "sns" / "ses_bounce_notification.json"


def fixture_message() -> dict[str, Any]:
    message: dict[str, Any] = json.loads(json.loads(FIXTURE.read_text())["Message"])
    return message


def parse(message: dict[str, Any] | str) -> list[dict[str, Any]]:
    text = message if isinstance(message, str) else json.dumps(message)
    return parse_ses_message(text, sns_message_id="sns-1", received_at_ms=123)


def test_aws_example_bounce() -> None:
    [record] = parse(fixture_message())
    assert record["event_type"] == "Bounce"
    assert (record["bounce_type"], record["bounce_sub_type"]) == ("Permanent", "General")
    assert record["recipient"] == "recipient@example.com"
    assert (record["campaign_id"], record["seq"]) == (42, 7)
    assert record["configuration_set"] == "flashsend-events"
    assert record["tags"] == {"campaign": "42", "seq": "7"}  # SES's own ses:* tags dropped
    assert record["detail"] == "5.1.1 smtp; 550 5.1.1 user unknown"
    assert record["occurred_at"] == parse_timestamp_ms("2026-05-08T12:00:05.123Z")
    assert record["source"] == "event_publishing" and record["received_at"] == 123
    codec = AvroCodec(registry_client("mock://unit"), "ses_event")
    assert codec.decode(codec.encode(record)) == record  # fits the contract


def test_event_id_is_the_same_for_the_same_event_whatever_the_sns_delivery() -> None:
    first = parse_ses_message(json.dumps(fixture_message()), sns_message_id="a", received_at_ms=1)
    again = parse_ses_message(json.dumps(fixture_message()), sns_message_id="b", received_at_ms=2)
    assert first[0]["event_id"] == again[0]["event_id"]
    assert first[0]["event_id"] != event_id("other-message", "Bounce", "recipient@example.com")
    assert first[0]["event_id"] != event_id(
        fixture_message()["mail"]["messageId"], "Delivery", "recipient@example.com"
    )


def test_one_record_per_recipient_normalised_and_deduplicated() -> None:
    message = fixture_message()
    message["bounce"]["bouncedRecipients"] = [
        {"emailAddress": "Jane <Jane.Doe@Example.COM>", "status": "5.1.1"},
        {"emailAddress": "jane.doe@example.com"},
        {"emailAddress": " bob@example.com "},
        {"emailAddress": 42},
    ]
    records = parse(message)
    assert [r["recipient"] for r in records] == ["jane.doe@example.com", "bob@example.com"]
    assert len({r["event_id"] for r in records}) == 2
    assert records[0]["detail"] == "5.1.1"


@pytest.mark.parametrize(
    ("event_type", "detail_key", "detail", "recipients"),
    [
        ("Send", "send", {}, ["recipient@example.com"]),
        (
            "Delivery",
            "delivery",
            {"recipients": ["a@x.test"], "smtpResponse": "250 ok"},
            ["a@x.test"],
        ),
        (
            "Complaint",
            "complaint",
            {
                "complainedRecipients": [{"emailAddress": "c@x.test"}],
                "complaintFeedbackType": "abuse",
            },
            ["c@x.test"],
        ),
        (
            "DeliveryDelay",
            "deliveryDelay",
            {"delayedRecipients": [{"emailAddress": "d@x.test", "status": "4.4.1"}]},
            ["d@x.test"],
        ),
        ("Reject", "reject", {"reason": "Bad content"}, ["recipient@example.com"]),
        ("Rendering Failure", "failure", {"errorMessage": "no var"}, ["recipient@example.com"]),
        ("Open", "open", {"ipAddress": "192.0.2.1"}, ["recipient@example.com"]),
    ],
)
def test_every_event_type_finds_its_recipients(
    event_type: str, detail_key: str, detail: dict[str, Any], recipients: list[str]
) -> None:
    message = fixture_message()
    del message["bounce"]
    message["eventType"] = event_type
    message[detail_key] = detail
    records = parse(message)
    assert [r["recipient"] for r in records] == recipients
    assert all(r["event_type"] == event_type and r["bounce_type"] is None for r in records)


def test_identity_notifications_have_no_tags() -> None:
    message = fixture_message()
    message["notificationType"] = message.pop("eventType")
    del message["mail"]["tags"]
    [record] = parse(message)
    assert record["source"] == "notification" and record["event_type"] == "Bounce"
    assert record["campaign_id"] is None and record["tags"] == {}


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("not json", "not_json"),
        ("[1, 2]", "not_an_object"),
        ('{"mail": {"messageId": "m"}}', "no_event_type"),
        ('{"eventType": "Bounce"}', "no_mail"),
        ('{"eventType": "Bounce", "mail": {}}', "no_message_id"),
        ('{"eventType": "Bounce", "mail": {"messageId": "m"}, "bounce": {}}', "no_recipients"),
    ],
)
def test_unreadable_messages_are_named(message: str, reason: str) -> None:
    with pytest.raises(SesEventInvalid) as info:
        parse(message)
    assert info.value.reason == reason


def test_non_numeric_campaign_tag_is_ignored() -> None:
    message = fixture_message()
    message["mail"]["tags"]["campaign"] = ["spring-sale"]
    [record] = parse(message)
    assert record["campaign_id"] is None and record["tags"]["campaign"] == "spring-sale"


@pytest.mark.parametrize(
    "parts",
    [
        ("0100018f-aaaa-bbbb-cccc-ddddeeeeffff-000000", "Delivery", "user@example.com"),
        ("m-1", "Rendering Failure", "ünïcode@example.com"),
        ("", "", ""),
    ],
)
def test_event_id_is_the_rfc_4122_uuid5_of_message_type_and_recipient(
    parts: tuple[str, str, str],
) -> None:
    assert event_id(*parts) == str(uuid.uuid5(EVENT_NAMESPACE, "/".join(parts)))
