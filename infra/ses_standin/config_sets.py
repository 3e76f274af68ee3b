"""SESv2 configuration sets and their event destinations, as stored settings.

CreateConfigurationSet, GetConfigurationSet, DeleteConfigurationSet,
CreateConfigurationSetEventDestination, GetConfigurationSetEventDestinations,
UpdateConfigurationSetEventDestination and DeleteConfigurationSetEventDestination, on botocore's
`sesv2` paths (routes in `server.py`), so `flashsend aws apply` runs unchanged against the
stand-in. Sending does not require the configuration set to exist. For SNS destinations,
which events reach whom is decided by the stand-in's subscriptions (`/_admin/subscriptions`,
`/_admin/sqs-subscriptions`), since the SNS topic an event destination names is not emulated.
A `KinesisFirehoseDestination` is acted on: its matching events go to the delivery stream its
`DeliveryStreamArn` names (`firehose.py`; `firehose_routes`) while that stream exists and the
destination is enabled. Persisted in `configuration-sets.json` in the state dir, rewritten on
each change.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.ses_standin.errors import AlreadyExists, BadRequest, NotFound
from infra.ses_standin.state_file import save_json

DESTINATION_KINDS = (
    "SnsDestination",
    "CloudWatchDestination",
    "KinesisFirehoseDestination",
    "EventBridgeDestination",
    "PinpointDestination",
)
OPTIONS = (
    "TrackingOptions",
    "DeliveryOptions",
    "ReputationOptions",
    "SendingOptions",
    "SuppressionOptions",
    "VdmOptions",
)
# MatchingEventTypes → the `eventType` of the SES event JSON.
EVENT_NAMES = {
    "SEND": "Send",
    "REJECT": "Reject",
    "BOUNCE": "Bounce",
    "COMPLAINT": "Complaint",
    "DELIVERY": "Delivery",
    "OPEN": "Open",
    "CLICK": "Click",
    "RENDERING_FAILURE": "Rendering Failure",
    "DELIVERY_DELAY": "DeliveryDelay",
    "SUBSCRIPTION": "Subscription",
}
EVENT_TYPES = frozenset(EVENT_NAMES)
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOPIC_ARN = re.compile(r"arn:aws[a-z0-9-]*:sns:[a-z0-9-]+:\d{12}:[^:]+")
_STREAM_ARN = re.compile(r"arn:aws[a-z0-9-]*:firehose:[a-z0-9-]+:\d{12}:deliverystream/[\w.-]+")
_ROLE_ARN = re.compile(r"arn:aws[a-z0-9-]*:iam::\d{12}:role/[\w+=,.@/-]+")


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or _NAME.fullmatch(value) is None:
        raise BadRequest(f"Invalid {what} {value!r}: up to 64 letters, digits, '_' or '-'.")
    return value


def parse_destination(body: Any) -> dict[str, Any]:
    """An `EventDestinationDefinition` (pure): enabled flag, event types, one destination."""
    if not isinstance(body, dict):
        raise BadRequest("EventDestination must be an object.")
    types = body.get("MatchingEventTypes")
    if not isinstance(types, list) or not types or not set(types) <= EVENT_TYPES:
        raise BadRequest(f"MatchingEventTypes must be a non-empty list of {sorted(EVENT_TYPES)}.")
    kinds = [k for k in DESTINATION_KINDS if body.get(k) is not None]
    if len(kinds) != 1:
        raise BadRequest("Exactly one destination (e.g. SnsDestination) must be given.")
    if kinds == ["SnsDestination"]:
        arn = (body["SnsDestination"] or {}).get("TopicArn")
        if not isinstance(arn, str) or _TOPIC_ARN.fullmatch(arn) is None:
            raise BadRequest(f"SnsDestination.TopicArn is not an SNS topic ARN: {arn!r}")
    if kinds == ["KinesisFirehoseDestination"]:
        firehose = body["KinesisFirehoseDestination"] or {}
        stream, role = firehose.get("DeliveryStreamArn"), firehose.get("IamRoleArn")
        if not isinstance(stream, str) or _STREAM_ARN.fullmatch(stream) is None:
            raise BadRequest(f"KinesisFirehoseDestination.DeliveryStreamArn is invalid: {stream!r}")
        if not isinstance(role, str) or _ROLE_ARN.fullmatch(role) is None:
            raise BadRequest(f"KinesisFirehoseDestination.IamRoleArn is invalid: {role!r}")
    return {
        "Enabled": bool(body.get("Enabled", False)),
        "MatchingEventTypes": list(dict.fromkeys(types)),
        kinds[0]: body[kinds[0]],
    }


class ConfigurationSets:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sets: dict[str, dict[str, Any]] = {}
        self.on_change: list[Callable[[], None]] = []  # run after each change
        if path.exists():
            self.sets = json.loads(path.read_text(encoding="utf-8") or "{}")

    def _get(self, name: str) -> dict[str, Any]:
        found = self.sets.get(name)
        if found is None:
            raise NotFound(f"Configuration set <{name}> does not exist.")
        return found

    def create(self, body: dict[str, Any]) -> None:
        name = _name(body.get("ConfigurationSetName"), "configuration set name")
        if name in self.sets:
            raise AlreadyExists(f"Configuration set <{name}> already exists.")
        options = {k: body[k] for k in OPTIONS if isinstance(body.get(k), dict)}
        self.sets[name] = {"options": options, "destinations": {}}
        self._save()

    def get(self, name: str) -> dict[str, Any]:
        found = self._get(name)
        return {"ConfigurationSetName": name, **found["options"], "Tags": []}

    def delete(self, name: str) -> None:
        self._get(name)
        del self.sets[name]
        self._save()

    def destinations(self, name: str) -> dict[str, Any]:
        found = self._get(name)
        return {
            "EventDestinations": [
                {"Name": dest_name, **dest} for dest_name, dest in found["destinations"].items()
            ]
        }

    def put_destination(self, name: str, dest_name: str, body: Any, *, create: bool) -> None:
        found = self._get(name)
        _name(dest_name, "event destination name")
        exists = dest_name in found["destinations"]
        if create and exists:
            raise AlreadyExists(f"Event destination {dest_name} already exists in <{name}>.")
        if not create and not exists:
            raise NotFound(f"Event destination {dest_name} does not exist in <{name}>.")
        found["destinations"][dest_name] = parse_destination(body)
        self._save()

    def delete_destination(self, name: str, dest_name: str) -> None:
        found = self._get(name)
        if found["destinations"].pop(dest_name, None) is None:
            raise NotFound(f"Event destination {dest_name} does not exist in <{name}>.")
        self._save()

    def firehose_routes(self) -> dict[str, dict[str, Any]]:
        """The enabled Firehose event destinations: `"<set>/<destination>"` → the set, the
        stream ARN and the event types (the event JSON's names) it publishes there."""
        routes: dict[str, dict[str, Any]] = {}
        for name, found in self.sets.items():
            for dest_name, dest in found["destinations"].items():
                firehose = dest.get("KinesisFirehoseDestination")
                if not firehose or not dest.get("Enabled"):
                    continue
                routes[f"{name}/{dest_name}"] = {
                    "configuration_set": name,
                    "stream_arn": firehose["DeliveryStreamArn"],
                    "event_types": [EVENT_NAMES[t] for t in dest["MatchingEventTypes"]],
                }
        return routes

    def _save(self) -> None:
        save_json(self.path, self.sets)
        for hook in self.on_change:
            hook()
