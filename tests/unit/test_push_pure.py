"""The push channel's pure parts: the per-platform message, the verdict of a publish's error,
the delivery-failure event and its effect, and the stand-in's SNS account."""

from __future__ import annotations

import json

import pytest

from infra.ses_standin.faults import FaultConfig
from infra.ses_standin.push import PushAccount, PushError
from producers.push_events import is_push_data, parse_push_data
from producers.ses_events import SesEventInvalid
from streams.rules.push_feedback import PUSH_INVALID_TOKEN, push_effect
from streams.rules.push_message import (
    APNS_COLLAPSE_ID,
    APNS_TTL,
    PushContent,
    build_message,
    disabled_ids,
    endpoint_ids,
)
from streams.rules.push_outcomes import DeviceOutcome, classify_publish_error

CONTENT = PushContent("Sale for {{first_name}}", "Hi {{first_name}}, -50%", 600, "sale-1")
CONTEXT = {"campaign": "7", "seq": "3"}


def test_fcm_message_carries_body_data_ttl_and_collapse_key() -> None:
    message, _ = build_message(CONTENT, {"first_name": "Ann"}, CONTEXT, "FCM")
    doc = json.loads(message)
    assert doc["default"] == "Hi Ann, -50%"
    fcm = json.loads(doc["GCM"])
    assert fcm["notification"] == {"title": "Sale for Ann", "body": "Hi Ann, -50%"}
    assert fcm["data"] == CONTEXT
    assert fcm["time_to_live"] == 600 and fcm["collapse_key"] == "sale-1"
    assert "APNS" not in doc


def test_apns_message_takes_ttl_and_collapse_id_as_attributes() -> None:
    message, attributes = build_message(CONTENT, {"first_name": "Bo"}, CONTEXT, "APNS")
    apns = json.loads(json.loads(message)["APNS"])
    assert apns["aps"]["alert"] == {"title": "Sale for Bo", "body": "Hi Bo, -50%"}
    assert apns["campaign"] == "7" and apns["seq"] == "3"
    assert attributes == {APNS_TTL: "600", APNS_COLLAPSE_ID: "sale-1"}


def test_no_ttl_or_collapse_key_when_the_campaign_has_none() -> None:
    content = PushContent("t", "b", None, None)
    message, attributes = build_message(content, {}, CONTEXT, "FCM")
    fcm = json.loads(json.loads(message)["GCM"])
    assert "time_to_live" not in fcm and "collapse_key" not in fcm and attributes == {}


def test_endpoint_ids_of_a_row_address() -> None:
    assert endpoint_ids("3,17,42") == [3, 17, 42]
    assert endpoint_ids("3,d17,42") == [3, 42] and disabled_ids("3,d17,42") == [17]
    assert endpoint_ids("") == [] == disabled_ids("")


@pytest.mark.parametrize(
    ("code", "status", "timed_out", "outcome"),
    [
        ("Throttling", 400, False, DeviceOutcome.RETRY),
        ("Throttled", 429, False, DeviceOutcome.RETRY),
        ("ConnectError", None, False, DeviceOutcome.RETRY),
        ("ReadTimeout", None, True, DeviceOutcome.UNKNOWN),
        ("InternalError", 500, False, DeviceOutcome.UNKNOWN),
        ("EndpointDisabled", 400, False, DeviceOutcome.DISABLED),
        ("NotFound", 404, False, DeviceOutcome.DISABLED),
        ("PlatformApplicationDisabled", 400, False, DeviceOutcome.PAUSE_CAMPAIGN),
        ("AuthorizationError", 403, False, DeviceOutcome.PAUSE_CAMPAIGN),
        ("InvalidParameter", 400, False, DeviceOutcome.FAILED),
    ],
)
def test_publish_errors(code: str, status: int | None, timed_out: bool, outcome: str) -> None:
    assert classify_publish_error(code, status, timed_out=timed_out).outcome is outcome


FAILURE = {
    "DeliveryAttempts": 1,
    "EndpointArn": "arn:aws:sns:us-east-1:000000000000:endpoint/GCM/app/abc",
    "EventType": "DeliveryFailure",
    "FailureMessage": "Platform token associated with the endpoint is not valid",
    "FailureType": "InvalidPlatformToken",
    "MessageId": "m-1",
    "Resource": "arn:aws:sns:us-east-1:000000000000:app/GCM/app",
    "Service": "SNS",
    "Time": "2026-12-07T21:00:00.000Z",
}


def test_an_invalid_token_event_suppresses_the_endpoint_arn() -> None:
    assert is_push_data(FAILURE)
    [record] = parse_push_data(FAILURE, sns_message_id="s-1", received_at_ms=1)
    assert record["recipient"] == FAILURE["EndpointArn"]
    assert record["occurred_at"] > 1
    again = parse_push_data(FAILURE, sns_message_id="s-2", received_at_ms=2)[0]
    assert again["event_id"] == record["event_id"]  # a redelivery is the same event
    effect = push_effect(record)
    assert effect.email == FAILURE["EndpointArn"] and effect.suppress_reason == PUSH_INVALID_TOKEN


def test_other_failures_disable_nothing() -> None:
    data = {**FAILURE, "FailureType": "DeliveryFailure", "FailureMessage": "platform down"}
    [record] = parse_push_data(data, sns_message_id="s-1", received_at_ms=1)
    assert push_effect(record).suppress_reason is None


def test_an_event_without_an_endpoint_arn_is_refused() -> None:
    with pytest.raises(SesEventInvalid):
        parse_push_data(
            {**FAILURE, "EndpointArn": "arn:aws:sns:x:1:topic"},
            sns_message_id="s",
            received_at_ms=1,
        )
    assert not is_push_data({"eventType": "Delivery", "mail": {}})


def _account(config: FaultConfig) -> tuple[PushAccount, str]:
    account = PushAccount(lambda: config, lambda _p: False)
    app = account.create_application("app", "GCM", {"EventDeliveryFailure": "arn:aws:sns:t"})
    return account, app


def _message(campaign: str = "1") -> str:
    return json.dumps({"default": "x", "GCM": json.dumps({"data": {"campaign": campaign}})})


def test_standin_endpoint_is_idempotent_per_token_and_counts_duplicates() -> None:
    account, app = _account(FaultConfig())
    arn = account.create_endpoint(app, "tok", None, {})
    assert account.create_endpoint(app, "tok", None, {}) == arn
    with pytest.raises(PushError) as differs:
        account.create_endpoint(app, "tok", None, {"Enabled": "false"})
    assert differs.value.code == "InvalidParameter"
    account.publish(arn, _message(), "json", 1.0)
    account.publish(arn, _message(), "json", 2.0)
    assert account.stats("1")["duplicates"] == 1


def test_standin_disabled_endpoint_and_rate() -> None:
    account, app = _account(FaultConfig(mobile_push_mps=2))
    arn = account.create_endpoint(app, "tok", None, {})
    outcomes = []
    for _ in range(3):
        try:
            account.publish(arn, _message(), "json", 10.0)
            outcomes.append("ok")
        except PushError as exc:
            outcomes.append(exc.code)
    assert outcomes == ["ok", "ok", "Throttling"]
    account.set_attributes(arn, {"Enabled": "false"})
    with pytest.raises(PushError) as disabled:
        account.publish(arn, _message(), "json", 20.0)
    assert disabled.value.code == "EndpointDisabled"


def test_standin_invalid_token_is_accepted_once_then_disabled_with_an_event() -> None:
    account, app = _account(FaultConfig())
    events: list[tuple[dict[str, object], str]] = []
    account.on_event.append(lambda event, topic: events.append((event, topic)))
    arn = account.create_endpoint(app, "dead", None, {})
    assert account.invalidate("dead") == 1
    assert account.publish(arn, _message(), "json", 1.0)
    assert account.get_attributes(arn)["Enabled"] == "false"
    [(event, topic)] = events
    assert topic == "arn:aws:sns:t" and event["FailureType"] == "InvalidPlatformToken"
    assert is_push_data(event)
    with pytest.raises(PushError):
        account.publish(arn, _message(), "json", 2.0)


def test_standin_json_structure_needs_a_default() -> None:
    account, app = _account(FaultConfig())
    arn = account.create_endpoint(app, "tok", None, {})
    with pytest.raises(PushError) as bad:
        account.publish(arn, json.dumps({"GCM": "{}"}), "json", 1.0)
    assert bad.value.code == "InvalidParameter"
