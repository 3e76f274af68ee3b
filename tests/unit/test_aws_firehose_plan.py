"""`flashsend aws plan --path firehose`: the stream, the event destinations that name it, the
IAM roles and bucket it needs but `apply` does not make (pure)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from infra.aws_firehose import KEY_TAG, MAX_RETRY_S, CurrentStream, FirehoseStream
from infra.aws_plan import Current, Desired, Options, desired, plan

TOPIC = "arn:aws:sns:eu-west-1:123456789012:flashsend-ses-events"
STREAM_ARN = "arn:aws:firehose:eu-west-1:123456789012:deliverystream/flashsend-ses-events"


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
        firehose_url="https://hooks.example.com/firehose",
        firehose_access_key="k1",
        sms_configuration_set="",
    )
    return replace(base, **changes)


def in_place(d: Desired, missing: tuple[str, ...] = ()) -> Current:
    """What AWS answers once `d` is in place (no access key in the description, as AWS)."""
    assert d.firehose is not None
    config = d.firehose.destination()
    http = {k: v for k, v in config.items() if k != "S3Configuration"}
    http["EndpointConfiguration"] = {
        k: v for k, v in config["EndpointConfiguration"].items() if k != "AccessKey"
    }
    http["S3DestinationDescription"] = config["S3Configuration"]
    stream = CurrentStream(
        "ACTIVE", "3", "destinationId-000000000001", http, {KEY_TAG: d.firehose.key_fingerprint}
    )
    firehose = {"IamRoleArn": d.firehose.ses_role, "DeliveryStreamArn": d.firehose.arn}
    destination = {
        "Name": d.destination,
        "Enabled": True,
        "MatchingEventTypes": list(reversed(d.event_types)),
        "KinesisFirehoseDestination": firehose,
    }
    sets: dict[str, Any] = {n: {d.destination: destination} for n in d.configuration_sets}
    return Current(configuration_sets=sets, queues={}, stream=stream, missing=missing)


def test_the_firehose_path_from_nothing_makes_the_stream_then_the_destinations() -> None:
    d = desired(options(), "firehose")
    assert d.firehose is not None and d.queues == {} and not d.uses_sns
    p = plan(d, Current(configuration_sets={"marketing": None, "transactional": None}, queues={}))
    ops = [(a.service, a.operation) for a in p.actions]
    assert ops[0] == ("firehose", "create_delivery_stream")
    assert ("sns", "create_topic") not in ops and all(s != "sqs" for s, _ in ops)
    created = p.actions[0].params["HttpEndpointDestinationConfiguration"]
    assert created["EndpointConfiguration"] == {
        "Url": "https://hooks.example.com/firehose",
        "Name": "flashsend-webhook",
        "AccessKey": "k1",
    }
    assert created["RetryOptions"] == {"DurationInSeconds": MAX_RETRY_S}
    assert created["RequestConfiguration"] == {"ContentEncoding": "GZIP"}
    assert created["BufferingHints"] == {"SizeInMBs": 1, "IntervalInSeconds": 1}
    assert created["S3BackupMode"] == "FailedDataOnly"
    assert (
        created["S3Configuration"]["BucketARN"] == "arn:aws:s3:::flashsend-ses-events-123456789012"
    )
    destinations = [a for a in p.actions if a.operation.endswith("event_destination")]
    assert len(destinations) == 2
    assert destinations[0].params["EventDestination"]["KinesisFirehoseDestination"] == {
        "IamRoleArn": "arn:aws:iam::123456789012:role/flashsend-ses-to-firehose",
        "DeliveryStreamArn": STREAM_ARN,
    }


def test_in_place_is_up_to_date_and_a_rotated_key_or_other_buffering_is_a_change() -> None:
    d = desired(options(), "firehose")
    assert plan(d, in_place(d)).changes == 0
    rotated = desired(options(firehose_access_key="k2"), "firehose")
    p = plan(rotated, in_place(d))
    assert [a.operation for a in p.actions] == ["update_destination", "tag_delivery_stream"]
    update = p.actions[0].params
    assert update["CurrentDeliveryStreamVersionId"] == "3"
    assert update["HttpEndpointDestinationUpdate"]["EndpointConfiguration"]["AccessKey"] == "k2"
    slower = desired(options(firehose_buffer_s=60), "firehose")
    assert [a.operation for a in plan(slower, in_place(d)).actions] == ["update_destination"]


def test_an_sns_destination_is_switched_to_the_stream() -> None:
    d = desired(options(), "firehose")
    current = in_place(d)
    for dests in current.configuration_sets.values():
        assert dests is not None
        dests[d.destination] = {
            "Enabled": True,
            "MatchingEventTypes": list(d.event_types),
            "SnsDestination": {"TopicArn": TOPIC},
        }
    p = plan(d, current)
    assert [a.operation for a in p.actions] == ["update_configuration_set_event_destination"] * 2
    assert "SnsDestination" not in p.actions[0].params["EventDestination"]


def test_missing_roles_and_bucket_are_reported_never_made() -> None:
    d = desired(options(), "firehose")
    assert isinstance(d.firehose, FirehoseStream)
    p = plan(d, in_place(d, missing=(d.firehose.backup_role, d.firehose.bucket_arn)))
    assert p.missing == (d.firehose.backup_role, d.firehose.bucket_arn)
    assert all(a.service in ("firehose", "ses") for a in p.actions)
    assert any(
        "IAM role arn:aws:iam::123456789012:role/flashsend-ses-to-firehose" in n for n in p.notes
    )


def test_locally_the_roles_and_bucket_are_named_not_checked() -> None:
    local = desired(options(local=True, firehose_url="http://127.0.0.1:1/firehose"), "firehose")
    p = plan(local, replace(in_place(local), missing=None))
    assert p.changes == 0 and p.missing == ()
    assert any("not emulated locally" in n for n in p.notes)
    assert any(n.startswith("S3 bucket flashsend-ses-events-123456789012") for n in p.notes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"firehose_access_key": ""}, "FLASHSEND_FIREHOSE_ACCESS_KEYS"),
        ({"webhook_url": "http://hooks.example.com/sns"}, "https"),
        ({"firehose_buffer_mb": 0}, "FLASHSEND_FIREHOSE_BUFFER_MB"),
    ],
)
def test_what_the_firehose_path_refuses(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        desired(options(**changes), "firehose")


def test_with_sms_on_aws_the_topic_stays_for_the_sms_events() -> None:
    d = desired(options(sms_configuration_set="marketing-sms"), "firehose")
    assert d.uses_sns
    ops = [a.operation for a in plan(d, in_place(d)).actions]
    assert "create_topic" in ops and "subscribe" in ops
