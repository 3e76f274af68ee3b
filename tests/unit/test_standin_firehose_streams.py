"""The stand-in's Firehose delivery streams and Firehose event destinations (pure parts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.ses_standin.config_sets import ConfigurationSets
from infra.ses_standin.errors import BadRequest
from infra.ses_standin.firehose import DeliveryStreams, FirehoseError, stream_arn

ROLE = "arn:aws:iam::000000000000:role/r"


def destination(**overrides: Any) -> dict[str, Any]:
    return {
        "EndpointConfiguration": {"Url": "https://hooks.example/firehose", "AccessKey": "k"},
        "S3Configuration": {"RoleARN": ROLE, "BucketARN": "arn:aws:s3:::b"},
        **overrides,
    }


def create(streams: DeliveryStreams, name: str = "s", **overrides: Any) -> dict[str, Any]:
    body = {"DeliveryStreamName": name, "HttpEndpointDestinationConfiguration": destination()}
    body["HttpEndpointDestinationConfiguration"].update(overrides)
    return streams.call("CreateDeliveryStream", body, 1.0)


def test_defaults_are_firehoses_and_the_access_key_is_never_described(tmp_path: Path) -> None:
    streams = DeliveryStreams(tmp_path / "streams.json")
    assert create(streams) == {"DeliveryStreamARN": stream_arn("s")}
    config = streams.delivery_config("s")
    assert config == {
        "name": "s",
        "arn": stream_arn("s"),
        "url": "https://hooks.example/firehose",
        "access_key": "k",
        "size_mb": 5,
        "interval_s": 300,
        "retry_s": 300,
        "gzip": False,
    }
    described = streams.call("DescribeDeliveryStream", {"DeliveryStreamName": "s"})
    [dest] = described["DeliveryStreamDescription"]["Destinations"]
    http = dest["HttpEndpointDestinationDescription"]
    assert "AccessKey" not in http["EndpointConfiguration"]
    assert http["S3DestinationDescription"]["BucketARN"] == "arn:aws:s3:::b"
    # Persisted: a restarted stand-in has the stream, key included.
    assert DeliveryStreams(tmp_path / "streams.json").delivery_config("s") == config


def test_update_destination_merges_and_checks_the_version(tmp_path: Path) -> None:
    streams = DeliveryStreams(tmp_path / "streams.json")
    create(streams, BufferingHints={"SizeInMBs": 1, "IntervalInSeconds": 0})
    update = {
        "DeliveryStreamName": "s",
        "CurrentDeliveryStreamVersionId": "1",
        "DestinationId": "destinationId-000000000001",
        "HttpEndpointDestinationUpdate": {
            "BufferingHints": {"SizeInMBs": 2},
            "RequestConfiguration": {"ContentEncoding": "GZIP"},
        },
    }
    streams.call("UpdateDestination", update)
    config = streams.delivery_config("s")
    assert (config["size_mb"], config["interval_s"], config["gzip"]) == (2, 0, True)
    assert config["access_key"] == "k"  # not given in the update: kept
    with pytest.raises(FirehoseError) as stale:
        streams.call("UpdateDestination", update)
    assert stale.value.code == "ConcurrentModificationException"


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"BufferingHints": {"SizeInMBs": 65}}, "InvalidArgumentException"),
        ({"RetryOptions": {"DurationInSeconds": 7201}}, "InvalidArgumentException"),
        ({"RequestConfiguration": {"ContentEncoding": "ZSTD"}}, "InvalidArgumentException"),
        ({"S3Configuration": {"RoleARN": ROLE}}, "InvalidArgumentException"),
    ],
)
def test_what_firehose_refuses(tmp_path: Path, overrides: dict[str, Any], code: str) -> None:
    streams = DeliveryStreams(tmp_path / "streams.json")
    with pytest.raises(FirehoseError) as refused:
        create(streams, **overrides)
    assert refused.value.code == code
    assert streams.call("ListDeliveryStreams", {})["DeliveryStreamNames"] == []


def test_a_second_stream_of_the_same_name_and_an_unknown_one(tmp_path: Path) -> None:
    streams = DeliveryStreams(tmp_path / "streams.json")
    create(streams)
    with pytest.raises(FirehoseError) as again:
        create(streams)
    assert again.value.code == "ResourceInUseException"
    streams.call("DeleteDeliveryStream", {"DeliveryStreamName": "s"})
    with pytest.raises(FirehoseError) as gone:
        streams.call("DescribeDeliveryStream", {"DeliveryStreamName": "s"})
    assert gone.value.code == "ResourceNotFoundException"


def test_firehose_event_destinations_route_their_enabled_types(tmp_path: Path) -> None:
    sets = ConfigurationSets(tmp_path / "sets.json")
    changes: list[int] = []
    sets.on_change.append(lambda: changes.append(1))
    sets.create({"ConfigurationSetName": "marketing"})
    fh = {"IamRoleArn": ROLE, "DeliveryStreamArn": stream_arn("s")}
    sets.put_destination(
        "marketing",
        "events",
        {
            "Enabled": True,
            "MatchingEventTypes": ["DELIVERY", "RENDERING_FAILURE"],
            "KinesisFirehoseDestination": fh,
        },
        create=True,
    )
    sets.put_destination(
        "marketing",
        "off",
        {"Enabled": False, "MatchingEventTypes": ["SEND"], "KinesisFirehoseDestination": fh},
        create=True,
    )
    assert sets.firehose_routes() == {
        "marketing/events": {
            "configuration_set": "marketing",
            "stream_arn": stream_arn("s"),
            "event_types": ["Delivery", "Rendering Failure"],
        }
    }
    assert len(changes) == 3
    with pytest.raises(BadRequest):
        sets.put_destination(
            "marketing",
            "bad",
            {
                "Enabled": True,
                "MatchingEventTypes": ["SEND"],
                "KinesisFirehoseDestination": {**fh, "DeliveryStreamArn": "stream-s"},
            },
            create=True,
        )


def test_a_stream_arn_is_matched_by_name_in_the_one_account_and_region(tmp_path: Path) -> None:
    streams = DeliveryStreams(tmp_path / "streams.json")
    create(streams)
    assert streams.by_arn(stream_arn("s")) == "s"
    assert streams.by_arn("arn:aws:firehose:eu-west-1:123456789012:deliverystream/s") == "s"
    assert streams.by_arn(stream_arn("other")) is None
    assert streams.by_arn("arn:aws:sns:us-east-1:000000000000:s") is None
