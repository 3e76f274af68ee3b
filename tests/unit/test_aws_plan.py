"""`flashsend aws plan`: desired state, the comparison with what exists, the actions (pure)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from infra.aws_plan import (
    HTTP_DELIVERY_POLICY,
    SES_EVENT_TYPES,
    Current,
    CurrentSubscription,
    Desired,
    Options,
    canonical,
    check_delivery_policy,
    desired,
    plan,
    retry_window_s,
)

TOPIC = "arn:aws:sns:eu-west-1:123456789012:flashsend-ses-events"
QUEUE_ARN = "arn:aws:sqs:eu-west-1:123456789012:"


def options(**changes: Any) -> Options:
    base = Options(
        topic_arn=TOPIC,
        region="eu-west-1",
        configuration_sets=("marketing", "transactional"),
        destination="flashsend-events",
        queue="events",
        retention_s=14 * 86400,
        visibility_s=60,
        max_receive_count=10,
        webhook_url="https://hooks.example.com/sns",
        local=False,
    )
    return replace(base, **changes)


def nothing() -> Current:
    return Current(configuration_sets={"marketing": None, "transactional": None}, queues={})


def as_aws_answers(d: Desired) -> Current:
    """What AWS answers once `d` is in place, with AWS's own spellings: numbers in JSON as
    numbers, policies re-serialised, one-element lists as scalars, extra read-only
    attributes, event types in another order."""

    def reserialise(attributes: dict[str, str]) -> dict[str, str]:
        out = {"QueueArn": "x", "ApproximateNumberOfMessages": "3"}
        for k, v in attributes.items():
            if k == "RedrivePolicy":
                data = json.loads(v)
                if "maxReceiveCount" in data:
                    data["maxReceiveCount"] = int(data["maxReceiveCount"])
                v = json.dumps(data, indent=1)
            elif k == "Policy":
                data = json.loads(v)
                for st in data["Statement"]:
                    if isinstance(st.get("Action"), str):
                        st["Action"] = [st["Action"]]
                v = json.dumps(data)
            out[k] = v
        return out

    destination = {
        "Name": d.destination,
        "Enabled": True,
        "MatchingEventTypes": list(reversed(d.event_types)),
        "SnsDestination": {"TopicArn": d.topic_arn},
    }
    sub = d.subscription
    return Current(
        configuration_sets={name: {d.destination: destination} for name in d.configuration_sets},
        queues={name: (f"https://q/{name}", reserialise(a)) for name, a in d.queues.items()},
        topic={"TopicArn": d.topic_arn, **d.topic_attributes},
        subscriptions=(
            CurrentSubscription(
                f"{d.topic_arn}:0f0f",
                sub.protocol,
                sub.endpoint,
                {"Owner": "123456789012", **reserialise(sub.attributes)},
            ),
        ),
    )


def ops(p: Any) -> list[tuple[str, str]]:
    return [(a.service, a.operation) for a in p.actions]


def test_sqs_path_from_nothing_creates_everything_in_dependency_order() -> None:
    d = desired(options(), "sqs")
    p = plan(d, nothing())
    assert ops(p) == [
        ("sqs", "create_queue"),  # events-sns-dlq
        ("sqs", "create_queue"),  # events-dlq
        ("sqs", "create_queue"),  # events (its redrive names events-dlq)
        ("sns", "create_topic"),
        ("sns", "subscribe"),
        ("ses", "create_configuration_set"),
        ("ses", "create_configuration_set_event_destination"),
        ("ses", "create_configuration_set"),
        ("ses", "create_configuration_set_event_destination"),
    ]
    names = [a.params["QueueName"] for a in p.actions if a.operation == "create_queue"]
    assert names == ["events-sns-dlq", "events-dlq", "events"]


def test_sqs_queue_keeps_events_long_redrives_and_admits_only_the_topic() -> None:
    d = desired(options(), "sqs")
    q = d.queues["events"]
    assert q["MessageRetentionPeriod"] == str(14 * 86400)
    assert q["ReceiveMessageWaitTimeSeconds"] == "20"
    assert json.loads(q["RedrivePolicy"]) == {
        "deadLetterTargetArn": QUEUE_ARN + "events-dlq",
        "maxReceiveCount": 10,
    }
    (statement,) = json.loads(q["Policy"])["Statement"]
    assert statement["Principal"] == {"Service": "sns.amazonaws.com"}
    assert statement["Action"] == "sqs:SendMessage"
    assert statement["Resource"] == QUEUE_ARN + "events"
    assert statement["Condition"] == {"ArnEquals": {"aws:SourceArn": TOPIC}}
    sub = d.subscription
    assert (sub.protocol, sub.endpoint) == ("sqs", QUEUE_ARN + "events")
    assert sub.attributes["RawMessageDelivery"] == "true"
    assert json.loads(sub.attributes["RedrivePolicy"]) == {
        "deadLetterTargetArn": QUEUE_ARN + "events-sns-dlq"
    }


def test_ses_destinations_carry_the_types_the_feedback_loop_reads_and_not_open_or_click() -> None:
    d = desired(options(), "sqs")
    p = plan(d, nothing())
    dests = [a for a in p.actions if a.operation == "create_configuration_set_event_destination"]
    assert [a.params["ConfigurationSetName"] for a in dests] == ["marketing", "transactional"]
    for a in dests:
        dest = a.params["EventDestination"]
        assert set(dest["MatchingEventTypes"]) == {
            "BOUNCE",
            "COMPLAINT",
            "DELIVERY",
            "REJECT",
            "DELIVERY_DELAY",
            "RENDERING_FAILURE",
            "SEND",
        }
        assert dest["Enabled"] is True
        assert dest["SnsDestination"] == {"TopicArn": TOPIC}
    assert "OPEN" not in SES_EVENT_TYPES and "CLICK" not in SES_EVENT_TYPES


def test_destinations_follow_the_configured_event_types() -> None:
    """FLASHSEND_SES_EVENT_TYPES decides (Open and Click for engagement); the stand-in's SQS
    subscription leaves out what the stand-in never emits."""
    from flashsend import deliverability
    from flashsend.settings import Settings
    from infra.aws_apply import options_from

    default = options_from(Settings(ses_endpoint=None, sqs_endpoint=None))
    assert default.event_types == tuple(deliverability.matching_event_types(Settings()))
    engaged = Settings(ses_event_types=("Bounce", "Complaint", "Open", "Click"))
    o = options_from(engaged)
    assert o.event_types == tuple(deliverability.matching_event_types(engaged))
    d = desired(replace(o, topic_arn=TOPIC, region="eu-west-1", local=False), "sqs")
    [dest, *_] = [
        a
        for a in plan(d, nothing()).actions
        if a.service == "ses" and "event_destination" in a.operation
    ]
    assert dest.params["EventDestination"]["MatchingEventTypes"] == [
        "BOUNCE",
        "COMPLAINT",
        "OPEN",
        "CLICK",
    ]
    local = desired(replace(o, topic_arn=TOPIC, region="eu-west-1", local=True), "sqs")
    [sub] = [a for a in plan(local, nothing()).actions if a.service == "standin"]
    assert sub.params["event_types"] == ["Bounce", "Complaint"]
    with pytest.raises(ValueError, match="event types"):
        desired(options(event_types=("BOUNCE", "OPENED")), "sqs")


def test_topic_lets_ses_publish_for_our_configuration_sets_only() -> None:
    d = desired(options(), "sqs")
    statements = {s["Sid"]: s for s in json.loads(d.topic_attributes["Policy"])["Statement"]}
    ses = statements["SesEventPublishing"]
    assert ses["Principal"] == {"Service": "ses.amazonaws.com"}
    assert ses["Condition"]["StringEquals"] == {"AWS:SourceAccount": "123456789012"}
    assert ses["Condition"]["ArnLike"]["AWS:SourceArn"] == [
        "arn:aws:ses:eu-west-1:123456789012:configuration-set/marketing",
        "arn:aws:ses:eu-west-1:123456789012:configuration-set/transactional",
    ]


@pytest.mark.parametrize("path", ["sqs", "webhook"])
def test_a_second_plan_over_what_aws_answers_changes_nothing(path: str) -> None:
    d = desired(options(), path)
    p = plan(d, as_aws_answers(d))
    assert p.actions == ()
    assert len(p.up_to_date) == len(d.queues) + 2 + len(d.configuration_sets)


def test_only_the_attributes_that_differ_are_set() -> None:
    d = desired(options(), "sqs")
    current = as_aws_answers(d)
    url, attributes = current.queues["events"] or ("", {})
    drifted = dict(attributes, VisibilityTimeout="30")
    drifted["RedrivePolicy"] = json.dumps(
        {"deadLetterTargetArn": QUEUE_ARN + "events-dlq", "maxReceiveCount": 3}
    )
    p = plan(d, replace(current, queues={**current.queues, "events": (url, drifted)}))
    (action,) = p.actions
    assert action.operation == "set_queue_attributes"
    assert action.params["QueueUrl"] == url
    assert set(action.params["Attributes"]) == {"VisibilityTimeout", "RedrivePolicy"}


def test_a_subscription_without_raw_delivery_is_corrected_not_duplicated() -> None:
    d = desired(options(), "sqs")
    current = as_aws_answers(d)
    (sub,) = current.subscriptions
    wrong = replace(sub, attributes={**sub.attributes, "RawMessageDelivery": "false"})
    p = plan(d, replace(current, subscriptions=(wrong,)))
    (action,) = p.actions
    assert action.operation == "set_subscription_attributes"
    assert action.params == {
        "SubscriptionArn": sub.arn,
        "AttributeName": "RawMessageDelivery",
        "AttributeValue": "true",
    }


def test_a_pending_subscription_is_subscribed_again_with_a_note() -> None:
    d = desired(options(), "webhook")
    current = as_aws_answers(d)
    pending = replace(current.subscriptions[0], arn="PendingConfirmation", attributes={})
    p = plan(d, replace(current, subscriptions=(pending,)))
    assert ops(p) == [("sns", "subscribe")]
    assert any("pending confirmation" in n for n in p.notes)


def test_an_event_destination_with_other_types_is_updated_and_foreign_ones_kept() -> None:
    d = desired(options(), "sqs")
    current = as_aws_answers(d)
    ours = {
        "Name": d.destination,
        "Enabled": True,
        "MatchingEventTypes": ["OPEN", "CLICK", "BOUNCE"],
        "SnsDestination": {"TopicArn": TOPIC},
    }
    other = {"Name": "analytics", "Enabled": True, "MatchingEventTypes": ["OPEN"]}
    sets = dict(current.configuration_sets)
    sets["marketing"] = {d.destination: ours, "analytics": other}
    p = plan(d, replace(current, configuration_sets=sets))
    assert ops(p) == [("ses", "update_configuration_set_event_destination")]
    assert p.actions[0].params["ConfigurationSetName"] == "marketing"
    assert any("analytics" in n and "left as it is" in n for n in p.notes)


def test_webhook_path_retries_for_nearly_an_hour_then_dead_letters() -> None:
    d = desired(options(), "webhook")
    assert set(d.queues) == {"events-sns-dlq"}
    sub = d.subscription
    assert (sub.protocol, sub.endpoint) == ("https", "https://hooks.example.com/sns")
    policy = json.loads(sub.attributes["DeliveryPolicy"])
    assert 3400 <= retry_window_s(policy) <= 3600
    assert json.loads(sub.attributes["RedrivePolicy"]) == {
        "deadLetterTargetArn": QUEUE_ARN + "events-sns-dlq"
    }


def test_the_delivery_policy_is_within_sns_limits() -> None:
    check_delivery_policy(HTTP_DELIVERY_POLICY)
    p = HTTP_DELIVERY_POLICY["healthyRetryPolicy"]
    assert p["numRetries"] <= 100
    assert 1 <= p["minDelayTarget"] <= p["maxDelayTarget"] <= 3600
    assert (
        p["numRetries"]
        >= p["numNoDelayRetries"] + p["numMinDelayRetries"] + p["numMaxDelayRetries"]
    )


def test_retry_window_adds_up_the_phases() -> None:
    flat = {
        "healthyRetryPolicy": {
            "minDelayTarget": 20,
            "maxDelayTarget": 20,
            "numRetries": 3,
            "numMinDelayRetries": 3,
        }
    }
    assert retry_window_s(flat) == 60  # AWS's default: 3 retries 20 s apart
    too_long = {
        "healthyRetryPolicy": {
            "minDelayTarget": 60,
            "maxDelayTarget": 60,
            "numRetries": 61,
            "numMaxDelayRetries": 61,
        }
    }
    with pytest.raises(ValueError, match="3600"):
        check_delivery_policy(too_long)
    with pytest.raises(ValueError, match="numRetries"):
        check_delivery_policy(
            {"healthyRetryPolicy": {**flat["healthyRetryPolicy"], "numRetries": 101}}
        )


def test_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="placeholder account"):
        desired(options(topic_arn="arn:aws:sns:eu-west-1:000000000000:t"), "sqs")
    with pytest.raises(ValueError, match="own Region"):
        desired(options(region="us-east-1"), "sqs")
    with pytest.raises(ValueError, match="https"):
        desired(options(webhook_url="http://10.0.0.1:14567/sns"), "webhook")
    with pytest.raises(ValueError, match="not an SNS topic ARN"):
        desired(options(topic_arn="flashsend-ses-events"), "sqs")
    with pytest.raises(ValueError, match="path"):
        desired(options(), "lambda")


def test_local_plan_skips_sns_and_what_the_local_server_drops() -> None:
    local = options(topic_arn="arn:aws:sns:eu-west-1:000000000000:t", local=True)
    d = desired(local, "sqs")
    p = plan(d, Current(configuration_sets={"marketing": None, "transactional": None}, queues={}))
    assert ("sns", "create_topic") not in ops(p) and ("sns", "subscribe") not in ops(p)
    assert ops(p)[3] == ("standin", "subscribe")
    queue = next(a for a in p.actions if a.params.get("QueueName") == "events")
    assert "Policy" not in queue.params["Attributes"]
    assert "RedrivePolicy" in queue.params["Attributes"]
    assert any("SNS is not emulated locally" in n for n in p.notes)
    # A server that dropped them is up to date all the same.
    answered = {
        name: (
            f"http://q/{name}",
            {k: v for k, v in a.items() if k not in ("Policy", "MessageRetentionPeriod")},
        )
        for name, a in d.queues.items()
    }
    sub = {
        "topic_arn": d.topic_arn,
        "queue_url": "http://q/000000000000/events",
        "event_types": next(
            p_.params["event_types"] for p_ in p.actions if p_.service == "standin"
        ),
        "configuration_sets": ["transactional", "marketing"],
    }
    again = plan(d, Current(configuration_sets={}, queues=answered, standin_subscriptions=(sub,)))
    assert not [a for a in again.actions if a.service in ("sqs", "standin")]


def test_canonical_compares_json_as_aws_rewrites_it() -> None:
    assert canonical('{"a": [1], "b": {"c": true}}') == canonical('{"b":{"c":"true"},"a":"1"}')
    assert canonical('{"a": [2, 1]}') == canonical('{"a": [1, 2]}')
    assert canonical("30") == "30" and canonical("text") == "text"


def test_in_aws_the_queue_policy_and_retention_are_created_and_enforced() -> None:
    d = desired(options(), "sqs")
    create = next(a for a in plan(d, nothing()).actions if a.params.get("QueueName") == "events")
    assert {"Policy", "MessageRetentionPeriod"} <= set(create.params["Attributes"])
    current = as_aws_answers(d)
    url, attributes = current.queues["events"] or ("", {})
    no_policy = {k: v for k, v in attributes.items() if k != "Policy"}
    p = plan(d, replace(current, queues={**current.queues, "events": (url, no_policy)}))
    assert [set(a.params["Attributes"]) for a in p.actions] == [{"Policy"}]


SMS_SET = "marketing-sms"
NUMBER = {
    "PhoneNumberId": "phone-0f0f",
    "PhoneNumber": "+12065550100",
    "TwoWayEnabled": True,
    "TwoWayChannelArn": "arn:aws:sns:eu-west-1:123456789012:other",
}


def test_sms_set_up_adds_its_event_destination_two_way_and_the_topic_permission() -> None:
    d = desired(options(sms_configuration_set=SMS_SET, sms_number="+12065550100"), "webhook")
    statements = {s["Sid"]: s for s in json.loads(d.topic_attributes["Policy"])["Statement"]}
    sms = statements["SmsEventsAndReplies"]
    assert sms["Principal"] == {"Service": "sms-voice.amazonaws.com"}
    assert sms["Condition"]["StringEquals"] == {"AWS:SourceAccount": "123456789012"}
    p = plan(d, replace(nothing(), sms_phone_number=NUMBER))
    sms_actions = [a for a in p.actions if a.service == "sms"]
    assert [a.operation for a in sms_actions] == [
        "create_configuration_set",
        "create_event_destination",
        "update_phone_number",
    ]
    destination = sms_actions[1].params
    assert destination["SnsDestination"] == {"TopicArn": TOPIC}
    assert {"TEXT_DELIVERED", "TEXT_SUCCESSFUL", "TEXT_BLOCKED"} <= set(
        destination["MatchingEventTypes"]
    )
    assert not {"TEXT_QUEUED", "TEXT_PENDING", "TEXT_UNKNOWN"} & set(
        destination["MatchingEventTypes"]
    )
    assert sms_actions[2].params == {
        "PhoneNumberId": "phone-0f0f",
        "TwoWayEnabled": True,
        "TwoWayChannelArn": TOPIC,
    }
    # What AWS answers once it is in place: nothing more to do.
    done = replace(
        as_aws_answers(d),
        sms_destinations={
            d.destination: {
                "EventDestinationName": d.destination,
                "Enabled": True,
                "MatchingEventTypes": list(reversed(destination["MatchingEventTypes"])),
                "SnsDestination": {"TopicArn": TOPIC},
            }
        },
        sms_phone_number={**NUMBER, "TwoWayEnabled": True, "TwoWayChannelArn": TOPIC},
    )
    again = plan(d, done)
    assert again.actions == ()
    assert any("two-way SMS of +12065550100" in ok for ok in again.up_to_date)


def test_sms_destination_to_another_topic_is_updated_and_a_pool_gets_a_note() -> None:
    d = desired(options(sms_configuration_set=SMS_SET, sms_number="pool-1"), "sqs")
    wrong = {
        d.destination: {
            "EventDestinationName": d.destination,
            "Enabled": True,
            "MatchingEventTypes": ["TEXT_ALL"],
            "SnsDestination": {"TopicArn": TOPIC + "-old"},
        }
    }
    p = plan(d, replace(nothing(), sms_destinations=wrong, sms_phone_number=None))
    assert [a.operation for a in p.actions if a.service == "sms"] == ["update_event_destination"]
    assert any("pool-1 is not a phone number of this account" in n for n in p.notes)


def test_without_an_sms_configuration_set_nothing_of_sms_is_planned() -> None:
    d = desired(options(), "sqs")
    statements = {s["Sid"] for s in json.loads(d.topic_attributes["Policy"])["Statement"]}
    assert "SmsEventsAndReplies" not in statements
    assert not [a for a in plan(d, nothing()).actions if a.service == "sms"]


def test_locally_the_sms_set_up_is_the_stacks_own() -> None:
    local = options(
        topic_arn="arn:aws:sns:eu-west-1:000000000000:t", local=True, sms_configuration_set=SMS_SET
    )
    p = plan(desired(local, "sqs"), nothing())
    assert not [a for a in p.actions if a.service == "sms"]
    assert any(n.startswith("SMS: locally `flashsend up`") for n in p.notes)
