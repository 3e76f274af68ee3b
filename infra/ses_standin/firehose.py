"""Amazon Data Firehose delivery streams, as far as SES event publishing needs them.

The control API over the JSON 1.1 protocol (POST /, `X-Amz-Target: Firehose_20150804.<Op>`,
`application/x-amz-json-1.1` bodies; errors are 400 with `{"__type": shape, "message": …}`),
enough for boto3's `firehose` client: CreateDeliveryStream, DescribeDeliveryStream,
DeleteDeliveryStream, ListDeliveryStreams, UpdateDestination, TagDeliveryStream and
ListTagsForDeliveryStream.

Emulated: DirectPut streams with an HTTP endpoint destination (EndpointConfiguration Url,
Name, AccessKey; BufferingHints SizeInMBs 1–64 (5) and IntervalInSeconds 0–900 (300);
RetryOptions DurationInSeconds 0–7200 (300); RequestConfiguration ContentEncoding NONE|GZIP;
S3BackupMode; S3Configuration). A stream is ACTIVE as soon as it is created (AWS: CREATING for
a minute or so). Like AWS, a description never shows the access key. The S3 backup is stored,
not written: what the emitter gives up on is counted as dropped (`/_admin/firehose`). Plain
http URLs are accepted (AWS takes https only) so local webhooks can be named. Persisted in
`firehose-streams.json` in the state dir, rewritten on each change.

Who delivers: SES configuration sets whose event destination is a `KinesisFirehoseDestination`
naming a stream's ARN; the emitter child process buffers and POSTs (`firehose_delivery.py`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.ses_standin.event_records import ACCOUNT_ID
from infra.ses_standin.state_file import save_json

TARGET_PREFIX = "Firehose_20150804."
CONTENT_TYPE = "application/x-amz-json-1.1"
DESTINATION_ID = "destinationId-000000000001"
_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,64}")
_DEFAULT_SIZE_MB = 5
_DEFAULT_INTERVAL_S = 300
_DEFAULT_RETRY_S = 300

Json = dict[str, Any]


class FirehoseError(Exception):
    """A Firehose error answer: `code` is its `__type`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def body(self) -> Json:
        return {"__type": self.code, "message": self.message}


def _invalid(message: str) -> FirehoseError:
    return FirehoseError("InvalidArgumentException", message)


def stream_arn(name: str, region: str = "us-east-1") -> str:
    return f"arn:aws:firehose:{region}:{ACCOUNT_ID}:deliverystream/{name}"


def _int(obj: Json, key: str, low: int, high: int, default: int, where: str) -> int:
    value = obj.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _invalid(f"{where}.{key} must be an integer between {low} and {high}.")
    return value


def _obj(obj: Json, key: str, where: str) -> Json:
    value = obj.get(key) or {}
    if not isinstance(value, dict):
        raise _invalid(f"{where}.{key} must be an object.")
    return value


def parse_http_destination(body: Any, old: Json | None = None) -> Json:
    """An HttpEndpointDestinationConfiguration (or, with `old`, an update of it) as stored:
    every field with its default filled in (pure)."""
    where = "HttpEndpointDestination"
    if not isinstance(body, dict):
        raise _invalid(f"{where}Configuration must be an object.")
    old = old or {}
    endpoint = body.get("EndpointConfiguration")
    if endpoint is None and old:
        endpoint = old["EndpointConfiguration"]
    if not isinstance(endpoint, dict) or not isinstance(endpoint.get("Url"), str):
        raise _invalid(f"{where}.EndpointConfiguration.Url is required.")
    url = endpoint["Url"]
    if not url.startswith(("https://", "http://")) or len(url) > 1000:
        raise _invalid(f"{where}.EndpointConfiguration.Url must be an https URL: {url!r}")
    kept_key = old.get("EndpointConfiguration", {}).get("AccessKey")
    access_key = endpoint.get("AccessKey", kept_key)
    if access_key is not None and not isinstance(access_key, str):
        raise _invalid(f"{where}.EndpointConfiguration.AccessKey must be a string.")
    hints = {**old.get("BufferingHints", {}), **_obj(body, "BufferingHints", where)}
    retry = {**old.get("RetryOptions", {}), **_obj(body, "RetryOptions", where)}
    request = {**old.get("RequestConfiguration", {}), **_obj(body, "RequestConfiguration", where)}
    encoding = request.get("ContentEncoding", "NONE")
    if encoding not in ("NONE", "GZIP"):
        raise _invalid(f"{where}.RequestConfiguration.ContentEncoding must be NONE or GZIP.")
    backup_mode = body.get("S3BackupMode", old.get("S3BackupMode", "FailedDataOnly"))
    if backup_mode not in ("FailedDataOnly", "AllData"):
        raise _invalid(f"{where}.S3BackupMode must be FailedDataOnly or AllData.")
    s3 = body.get("S3Configuration", body.get("S3Update"))
    s3 = {**old.get("S3Configuration", {}), **(s3 or {})}
    if not isinstance(s3.get("RoleARN"), str) or not isinstance(s3.get("BucketARN"), str):
        raise _invalid(f"{where}.S3Configuration needs RoleARN and BucketARN.")
    stored: Json = {
        "EndpointConfiguration": {
            k: v
            for k, v in (("Url", url), ("Name", endpoint.get("Name")), ("AccessKey", access_key))
            if v is not None
        },
        "BufferingHints": {
            "SizeInMBs": _int(hints, "SizeInMBs", 1, 64, _DEFAULT_SIZE_MB, where),
            "IntervalInSeconds": _int(
                hints, "IntervalInSeconds", 0, 900, _DEFAULT_INTERVAL_S, where
            ),
        },
        "RetryOptions": {
            "DurationInSeconds": _int(retry, "DurationInSeconds", 0, 7200, _DEFAULT_RETRY_S, where)
        },
        "RequestConfiguration": {**request, "ContentEncoding": encoding},
        "S3BackupMode": backup_mode,
        "S3Configuration": s3,
    }
    role = body.get("RoleARN", old.get("RoleARN"))
    if role is not None:
        stored["RoleARN"] = role
    return stored


def delivery_config(name: str, destination: Json, region: str = "us-east-1") -> Json:
    """What the emitter needs of a stream to deliver to it."""
    return {
        "name": name,
        "arn": stream_arn(name, region),
        "url": destination["EndpointConfiguration"]["Url"],
        "access_key": destination["EndpointConfiguration"].get("AccessKey", ""),
        "size_mb": destination["BufferingHints"]["SizeInMBs"],
        "interval_s": destination["BufferingHints"]["IntervalInSeconds"],
        "retry_s": destination["RetryOptions"]["DurationInSeconds"],
        "gzip": destination["RequestConfiguration"]["ContentEncoding"] == "GZIP",
    }


class DeliveryStreams:
    """Delivery streams by name, saved to a JSON file on every change; `on_change` hooks run
    after each change (the emission re-reads its routes)."""

    def __init__(self, path: Path, region: str = "us-east-1") -> None:
        self.path = path
        self.region = region
        self.streams: dict[str, Json] = {}
        self.on_change: list[Callable[[], None]] = []
        if path.exists():
            self.streams = json.loads(path.read_text(encoding="utf-8") or "{}")

    def by_arn(self, arn: str) -> str | None:
        """The name of the stream an ARN names, if it exists. The stand-in is one account in
        one Region: the ARN's Region and account are not compared, so a client configured
        for another Region (whose ARNs it computes itself) still reaches its stream."""
        parts = arn.split(":", 5)
        if len(parts) != 6 or parts[2] != "firehose":
            return None
        name = parts[5].removeprefix("deliverystream/")
        return name if name in self.streams else None

    def delivery_config(self, name: str) -> Json:
        return delivery_config(name, self.streams[name]["destination"], self.region)

    def _get(self, body: Json) -> tuple[str, Json]:
        name = body.get("DeliveryStreamName")
        found = self.streams.get(name) if isinstance(name, str) else None
        if found is None or not isinstance(name, str):
            raise FirehoseError(
                "ResourceNotFoundException",
                f"Firehose {name} under account {ACCOUNT_ID} not found.",
            )
        return name, found

    def call(self, operation: str, body: Json, now: float | None = None) -> Json:
        """One control-plane operation: its answer, or FirehoseError."""
        now = time.time() if now is None else now
        handler = {
            "CreateDeliveryStream": self.create,
            "DescribeDeliveryStream": self.describe,
            "DeleteDeliveryStream": self.delete,
            "ListDeliveryStreams": self.list,
            "UpdateDestination": self.update_destination,
            "TagDeliveryStream": self.tag,
            "ListTagsForDeliveryStream": self.list_tags,
        }.get(operation)
        if handler is None:
            raise FirehoseError("UnknownOperationException", f"{operation} is not emulated.")
        return handler(body, now)

    def create(self, body: Json, now: float) -> Json:
        name = body.get("DeliveryStreamName")
        if not isinstance(name, str) or _NAME.fullmatch(name) is None:
            raise _invalid(f"Invalid DeliveryStreamName {name!r}.")
        if body.get("DeliveryStreamType", "DirectPut") != "DirectPut":
            raise _invalid("Only DirectPut delivery streams are emulated.")
        others = [k for k in body if k.endswith("DestinationConfiguration")]
        if others != ["HttpEndpointDestinationConfiguration"]:
            raise _invalid("Exactly one HttpEndpointDestinationConfiguration is emulated.")
        if name in self.streams:
            raise FirehoseError(
                "ResourceInUseException", f"Firehose {name} under account {ACCOUNT_ID} exists."
            )
        destination = parse_http_destination(body["HttpEndpointDestinationConfiguration"])
        self.streams[name] = {
            "created": now,
            "updated": now,
            "version": 1,
            "destination": destination,
            "tags": _tags(body.get("Tags")),
        }
        self._changed()
        return {"DeliveryStreamARN": stream_arn(name, self.region)}

    def describe(self, body: Json, now: float) -> Json:
        name, found = self._get(body)
        destination = dict(found["destination"])
        endpoint = {k: v for k, v in destination["EndpointConfiguration"].items()}
        endpoint.pop("AccessKey", None)  # never shown, as on AWS
        destination["EndpointConfiguration"] = endpoint
        destination["S3DestinationDescription"] = destination.pop("S3Configuration")
        return {
            "DeliveryStreamDescription": {
                "DeliveryStreamName": name,
                "DeliveryStreamARN": stream_arn(name, self.region),
                "DeliveryStreamStatus": "ACTIVE",
                "DeliveryStreamType": "DirectPut",
                "VersionId": str(found["version"]),
                "CreateTimestamp": found["created"],
                "LastUpdateTimestamp": found["updated"],
                "Destinations": [
                    {
                        "DestinationId": DESTINATION_ID,
                        "HttpEndpointDestinationDescription": destination,
                    }
                ],
                "HasMoreDestinations": False,
            }
        }

    def delete(self, body: Json, now: float) -> Json:
        name, _found = self._get(body)
        del self.streams[name]
        self._changed()
        return {}

    def list(self, body: Json, now: float) -> Json:
        limit = _int(body, "Limit", 1, 10_000, 10, "ListDeliveryStreams")
        after = body.get("ExclusiveStartDeliveryStreamName") or ""
        kind = body.get("DeliveryStreamType")
        names = sorted(n for n in self.streams if n > after and kind in (None, "DirectPut"))
        return {"DeliveryStreamNames": names[:limit], "HasMoreDeliveryStreams": len(names) > limit}

    def update_destination(self, body: Json, now: float) -> Json:
        name, found = self._get(body)
        if body.get("CurrentDeliveryStreamVersionId") != str(found["version"]):
            raise FirehoseError(
                "ConcurrentModificationException",
                f"CurrentDeliveryStreamVersionId is not {found['version']}.",
            )
        if body.get("DestinationId") != DESTINATION_ID:
            raise _invalid(f"No destination {body.get('DestinationId')!r} in {name}.")
        update = body.get("HttpEndpointDestinationUpdate")
        if not isinstance(update, dict):
            raise _invalid("Only HttpEndpointDestinationUpdate is emulated.")
        found["destination"] = parse_http_destination(update, found["destination"])
        found["version"] += 1
        found["updated"] = now
        self._changed()
        return {}

    def tag(self, body: Json, now: float) -> Json:
        _name, found = self._get(body)
        found["tags"] = {**found["tags"], **_tags(body.get("Tags"))}
        self._changed()
        return {}

    def list_tags(self, body: Json, now: float) -> Json:
        _name, found = self._get(body)
        tags = [{"Key": k, "Value": v} for k, v in sorted(found["tags"].items())]
        return {"Tags": tags, "HasMoreTags": False}

    def _changed(self) -> None:
        save_json(self.path, self.streams)
        for hook in self.on_change:
            hook()


def _tags(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, list) or not all(isinstance(t, dict) and "Key" in t for t in raw):
        raise _invalid("Tags must be a list of {Key, Value}.")
    return {str(t["Key"]): str(t.get("Value", "")) for t in raw}
