"""SMS notifications → `ses_event` records → effects (pure), from AWS's published examples, and
the stand-in's side of the same shapes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.ses_standin.faults import FaultConfig
from infra.ses_standin.sms import SmsAccount, SmsError, SmsRecord
from infra.ses_standin.text_events import text_event
from producers.event_messages import parse_event_message
from producers.ses_events import SesEventInvalid
from schemas.serde import AvroCodec, registry_client
from streams.rules.resolution import FAILED, SENT
from streams.rules.sms_feedback import INBOUND, SMS_OPT_OUT, event_effect, opt_out_keyword

# "Messaging events", AWS End User Messaging user guide (SMS example log), with our context.
TEXT_EVENT: dict[str, Any] = {
    "eventType": "TEXT_SUCCESSFUL",
    "eventVersion": "1.0",
    "eventTimestamp": 1686975103470,
    "isFinal": True,
    "originationPhoneNumber": "+12065550152",
    "destinationPhoneNumber": "+14255550156",
    "isInternationalSend": False,
    "mcc": "310",
    "mnc": "800",
    "messageId": "862a8790-60c0-4430-9b2b-658bdexample",
    "messageRequestTimestamp": 1686975103170,
    "messageEncoding": "GSM",
    "messageType": "PROMOTIONAL",
    "messageStatus": "SUCCESSFUL",
    "messageStatusDescription": "Message has been accepted by phone carrier",
    "context": {"campaign": "42", "seq": "7"},
    "totalMessageParts": 1,
    "totalMessagePrice": 0.09582,
    "totalCarrierFee": 0.0,
}
# "Example of a two-way SMS message payload for Amazon SNS topics", sms-voice user guide.
INBOUND_MESSAGE: dict[str, Any] = {
    "originationNumber": "+14255550182",
    "destinationNumber": "+12125550101",
    "messageKeyword": "JOIN",
    "messageBody": "EXAMPLE",
    "inboundMessageId": "cae173d2-66b9-564c-8309-21f858e9fb84",
    "previousPublishedMessageId": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
}


def parse(message: dict[str, Any], sns_id: str = "sns-1") -> list[dict[str, Any]]:
    return parse_event_message(json.dumps(message), sns_message_id=sns_id, received_at_ms=123)


def test_aws_example_text_event_names_its_row_and_proves_it_sent() -> None:
    [record] = parse(TEXT_EVENT)
    assert record["event_type"] == "TEXT_SUCCESSFUL"
    assert record["source"] == "sms_event_destination"
    assert record["recipient"] == "+14255550156"
    assert record["ses_message_id"] == TEXT_EVENT["messageId"]
    assert (record["campaign_id"], record["seq"]) == (42, 7)
    assert record["tags"] == {"campaign": "42", "seq": "7"}
    assert record["occurred_at"] == 1686975103470
    assert record["detail"] == "SUCCESSFUL Message has been accepted by phone carrier"
    codec = AvroCodec(registry_client("mock://unit"), "ses_event")
    assert codec.decode(codec.encode(record)) == record  # fits the contract
    effect = event_effect(record)
    assert effect.proof is not None
    assert (effect.proof.campaign_id, effect.proof.seq, effect.proof.outcome) == (42, 7, SENT)
    assert effect.proof.email == "+14255550156"
    assert (effect.counter, effect.suppress_reason) == (None, None)
    assert effect.source_event == f"TEXT_SUCCESSFUL sms:{TEXT_EVENT['messageId']}"


@pytest.mark.parametrize(
    ("event_type", "outcome"),
    [
        ("TEXT_DELIVERED", SENT),
        ("TEXT_SUCCESSFUL", SENT),
        ("TEXT_BLOCKED", FAILED),
        ("TEXT_INVALID", FAILED),
        ("TEXT_SPAM", FAILED),
        ("TEXT_TTL_EXPIRED", FAILED),
        ("TEXT_UNREACHABLE", FAILED),
        ("TEXT_CARRIER_BLOCKED", FAILED),
        ("TEXT_QUEUED", None),
        ("TEXT_PENDING", None),
        ("TEXT_CARRIER_UNREACHABLE", None),  # temporary: a later event may still deliver it
        ("TEXT_UNKNOWN", None),
    ],
)
def test_each_text_event_type_proves_an_outcome_or_nothing(
    event_type: str, outcome: str | None
) -> None:
    [record] = parse({**TEXT_EVENT, "eventType": event_type})
    proof = event_effect(record).proof
    assert (proof.outcome if proof else None) == outcome


def test_a_text_event_without_our_context_proves_nothing() -> None:
    [record] = parse({**TEXT_EVENT, "context": {"account": "bar"}})
    assert event_effect(record).proof is None


def test_aws_example_reply_is_not_an_opt_out() -> None:
    [record] = parse(INBOUND_MESSAGE)
    assert (record["event_type"], record["source"]) == (INBOUND, "sms_two_way")
    assert record["recipient"] == "+14255550182"  # who replied: our recipient
    assert record["tags"] == {"keyword": "JOIN", "to": "+12125550101"}
    assert (record["detail"], record["received_at"], record["occurred_at"]) == ("EXAMPLE", 123, 123)
    codec = AvroCodec(registry_client("mock://unit"), "ses_event")
    assert codec.decode(codec.encode(record)) == record
    effect = event_effect(record)
    assert (effect.suppress_reason, effect.proof, effect.counter) == (None, None, None)


@pytest.mark.parametrize(
    ("body", "keyword"),
    [
        ("STOP", "STOP"),
        ("stop", "STOP"),
        (" Stop please ", "STOP"),
        ("unsubscribe", "UNSUBSCRIBE"),
        ("Opt-Out", "OPT-OUT"),
        ("optout", "OPTOUT"),
        ("arret", "ARRET"),
        ("cancel", "CANCEL"),
        ("END", "END"),
        ("quit", "QUIT"),
        ("remove", "REMOVE"),
        ("TD", "TD"),
        ("STOPPED", None),
        ("please stop", None),  # the keyword must begin the reply
        ("HELP", None),
        ("", None),
    ],
)
def test_replies_that_opt_out(body: str, keyword: str | None) -> None:
    assert opt_out_keyword(body) == keyword
    [record] = parse({**INBOUND_MESSAGE, "messageKeyword": "", "messageBody": body})
    effect = event_effect(record)
    assert effect.suppress_reason == (SMS_OPT_OUT if keyword else None)
    assert effect.email == "+14255550182"
    if keyword:
        assert (
            effect.source_event == f"{INBOUND} {keyword} sms:{INBOUND_MESSAGE['inboundMessageId']}"
        )


def test_the_keyword_aws_matched_counts_too() -> None:
    [record] = parse({**INBOUND_MESSAGE, "messageKeyword": "stop", "messageBody": "stahp"})
    assert event_effect(record).suppress_reason == SMS_OPT_OUT


def test_a_redelivered_notification_keeps_its_event_id() -> None:
    for message in (TEXT_EVENT, INBOUND_MESSAGE):
        assert parse(message, "sns-a")[0]["event_id"] == parse(message, "sns-b")[0]["event_id"]
    other = {**INBOUND_MESSAGE, "inboundMessageId": "another"}
    assert parse(other)[0]["event_id"] != parse(INBOUND_MESSAGE)[0]["event_id"]


def test_numbers_are_normalised_like_the_snapshot_does() -> None:
    [record] = parse({**INBOUND_MESSAGE, "originationNumber": "+1 (425) 555-0182"})
    assert record["recipient"] == "+14255550182"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ({**TEXT_EVENT, "messageId": None}, "no_message_id"),
        ({**TEXT_EVENT, "destinationPhoneNumber": "0912345678"}, "bad_phone_number"),
        ({k: v for k, v in TEXT_EVENT.items() if k != "destinationPhoneNumber"}, "no_phone_number"),
        ({**INBOUND_MESSAGE, "inboundMessageId": ""}, "no_message_id"),
        ({**INBOUND_MESSAGE, "originationNumber": 14255550182}, "no_phone_number"),
    ],
)
def test_unreadable_sms_notifications_are_refused_with_a_reason(
    message: dict[str, Any], reason: str
) -> None:
    with pytest.raises(SesEventInvalid) as refused:
        parse(message)
    assert refused.value.reason == reason


def test_ses_events_still_take_the_ses_path() -> None:
    bounce = {
        "eventType": "Bounce",
        "mail": {"messageId": "m-1", "destination": ["a@b.test"], "tags": {}},
        "bounce": {"bounceType": "Permanent", "bouncedRecipients": [{"emailAddress": "a@b.test"}]},
    }
    [record] = parse(bounce)
    assert record["source"] == "event_publishing"
    assert event_effect(record).suppress_reason == "bounce"


# ---- the stand-in's side --------------------------------------------------------------------


def _account() -> SmsAccount:
    return SmsAccount(lambda: FaultConfig(), lambda _p: False)


def test_standin_text_event_reads_back_as_its_row() -> None:
    account = _account()
    seen: list[SmsRecord] = []
    account.on_text.append(seen.append)
    body = {
        "DestinationPhoneNumber": "+84912340001",
        "OriginationIdentity": "+12065550100",
        "MessageBody": "hi",
        "ConfigurationSetName": "marketing-sms",
        "Context": {"campaign": "9", "seq": "3"},
    }
    message_id = account.send_text(body, 100.0)
    [record] = seen
    assert (record.message_id, record.configuration_set) == (message_id, "marketing-sms")
    [parsed] = parse(text_event(record, "TEXT_DELIVERED", 1_786_000_000_000))
    proof = event_effect(parsed).proof
    assert proof is not None
    assert (proof.campaign_id, proof.seq, proof.email, proof.outcome) == (
        9,
        3,
        "+84912340001",
        SENT,
    )
    assert proof.ses_message_id == message_id


def test_standin_publishes_replies_to_the_numbers_two_way_topic_only() -> None:
    account = _account()
    published: list[tuple[dict[str, Any], str]] = []
    account.on_inbound.append(lambda payload, topic: published.append((payload, topic)))
    account.inbound("+84912340001", "+12065550100", "hello", 1.0)
    assert published == []  # two-way is off by default
    topic = "arn:aws:sns:us-east-1:000000000000:inbound"
    answer = account.update_phone_number(
        {"PhoneNumberId": "+12065550100", "TwoWayEnabled": True, "TwoWayChannelArn": topic}
    )
    assert (answer["TwoWayEnabled"], answer["TwoWayChannelArn"]) == (True, topic)
    reply = account.inbound("+84912340001", "+12065550100", "stop", 2.0)
    assert reply["optedOut"] and reply["publishedTo"] == topic
    [(payload, to)] = published
    assert to == topic
    assert set(payload) == {
        "originationNumber",
        "destinationNumber",
        "messageKeyword",
        "messageBody",
        "inboundMessageId",
    }
    assert payload["messageKeyword"] == "STOP"
    assert "+84912340001" in account.opted_out["Default"]
    account.inbound("+84912340002", "+12065550199", "STOP", 3.0)  # another number: not on
    assert len(published) == 1
    with pytest.raises(SmsError):
        account.update_phone_number(
            {
                "PhoneNumberId": "+12065550100",
                "TwoWayEnabled": True,
                "TwoWayChannelArn": "not-an-arn",
            }
        )
