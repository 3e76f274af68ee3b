"""SESv2 configuration sets and their event destinations, as stored settings.

CreateConfigurationSet, GetConfigurationSet, DeleteConfigurationSet,
CreateConfigurationSetEventDestination, GetConfigurationSetEventDestinations,
UpdateConfigurationSetEventDestination and DeleteConfigurationSetEventDestination, on botocore's
`sesv2` paths (routes in `server.py`), so `flashsend aws apply` runs unchanged against the
stand-in. Only stored and answered: sending does not require the configuration set to exist,
and which events reach whom is decided by the stand-in's subscriptions
(`/_admin/subscriptions`, `/_admin/sqs-subscriptions`), since the SNS topic an event
destination names is not emulated. Persisted in `configuration-sets.json` in the state dir,
rewritten on each change.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from infra.ses_standin.errors import AlreadyExists, BadRequest, NotFound

EVENT_TYPES = frozenset(
    {
        "SEND",
        "REJECT",
        "BOUNCE",
        "COMPLAINT",
        "DELIVERY",
        "OPEN",
        "CLICK",
        "RENDERING_FAILURE",
        "DELIVERY_DELAY",
        "SUBSCRIPTION",
    }
)
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
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOPIC_ARN = re.compile(r"arn:aws[a-z0-9-]*:sns:[a-z0-9-]+:\d{12}:[^:]+")


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
    return {
        "Enabled": bool(body.get("Enabled", False)),
        "MatchingEventTypes": list(dict.fromkeys(types)),
        kinds[0]: body[kinds[0]],
    }


class ConfigurationSets:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sets: dict[str, dict[str, Any]] = {}
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

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.sets, indent=1), encoding="utf-8")
        tmp.replace(self.path)
