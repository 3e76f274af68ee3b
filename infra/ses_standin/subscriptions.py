"""SNS topic subscriptions of the stand-in's event destinations (HTTP/S endpoints only).

A subscription joins what SES and SNS keep apart: which messages publish events (the SES or
SMS configuration sets whose event destination points at the topic, None = every message), which
event types (`MatchingEventTypes`, None = all), the SNS topic, and the HTTP endpoint with its
signature version. As with SNS, a new subscription is `pending` until the endpoint GETs the
`SubscribeURL` of the signed SubscriptionConfirmation it was sent; only confirmed ones get
notifications. Subscribing the same endpoint to the same topic again returns the same
subscription (with the new filters). Persisted in the state dir, so a restart keeps them.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from infra.ses_standin.state_file import save_json
from infra.ses_standin.text_events import TEXT_EVENT_TYPES

EVENT_TYPES = (
    "Send",
    "Delivery",
    "Bounce",
    "Complaint",
    "Reject",
    "DeliveryDelay",
    "Rendering Failure",
    "Open",
    "Click",
)
_TOPIC_PREFIX = "arn:aws:sns:"


@dataclass(frozen=True)
class Subscription:
    id: str
    topic_arn: str
    endpoint: str
    token: str
    configuration_sets: tuple[str, ...] | None = None
    event_types: tuple[str, ...] | None = None
    signature_version: int = 1  # SNS's default; topics may be set to 2 (SHA256)
    status: str = "pending"  # pending | confirmed
    created_at: float = 0.0

    @property
    def arn(self) -> str:
        return f"{self.topic_arn}:{self.id}"

    def matches(self, configuration_set: str | None) -> bool:
        return self.configuration_sets is None or configuration_set in self.configuration_sets

    def wants(self, event_type: str) -> bool:
        return self.event_types is None or event_type in self.event_types

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["subscription_arn"] = self.arn if self.status == "confirmed" else "pending"
        return data


def parse_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """Validate `POST /_admin/subscriptions`; ValueError names the first problem."""
    endpoint = body.get("endpoint")
    if not isinstance(endpoint, str) or urlsplit(endpoint).scheme not in ("http", "https"):
        raise ValueError("endpoint must be an http(s) URL")
    topic = body.get("topic_arn")
    if not isinstance(topic, str) or not topic.startswith(_TOPIC_PREFIX) or " " in topic:
        raise ValueError("topic_arn must be an SNS topic ARN (arn:aws:sns:…)")
    out: dict[str, Any] = {"endpoint": endpoint, "topic_arn": topic}
    for key in ("configuration_sets", "event_types"):
        value = body.get(key)
        if value is None:
            out[key] = None
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ValueError(f"{key} must be a list of names or null")
        if key == "event_types" and not set(value) <= {*EVENT_TYPES, *TEXT_EVENT_TYPES}:
            raise ValueError(f"event_types must be among {[*EVENT_TYPES, *TEXT_EVENT_TYPES]}")
        out[key] = tuple(value)
    version = body.get("signature_version", 1)
    if version not in (1, 2):
        raise ValueError("signature_version must be 1 or 2")
    out["signature_version"] = version
    return out


class SubscriptionStore:
    """Subscriptions by id, saved to a JSON file on every change (a handful of entries)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._subs: dict[str, Subscription] = {}
        if path.exists():
            for item in json.loads(path.read_text() or "[]"):
                for key in ("configuration_sets", "event_types"):
                    if item.get(key) is not None:
                        item[key] = tuple(item[key])
                item.pop("subscription_arn", None)
                sub = Subscription(**item)
                self._subs[sub.id] = sub

    def all(self) -> list[Subscription]:
        return list(self._subs.values())

    def confirmed(self) -> list[Subscription]:
        return [s for s in self._subs.values() if s.status == "confirmed"]

    def get(self, sub_id: str) -> Subscription | None:
        return self._subs.get(sub_id)

    def subscribe(self, request: Mapping[str, Any], now: float) -> tuple[Subscription, bool]:
        """(subscription, whether a confirmation must be sent)."""
        for sub in self._subs.values():
            if sub.topic_arn == request["topic_arn"] and sub.endpoint == request["endpoint"]:
                updated = replace(
                    sub,
                    configuration_sets=request["configuration_sets"],
                    event_types=request["event_types"],
                    signature_version=request["signature_version"],
                )
                self._subs[sub.id] = updated
                self._save()
                return updated, updated.status != "confirmed"
        sub = Subscription(
            id=str(uuid.uuid4()),
            token=secrets.token_hex(64),
            created_at=now,
            **request,
        )
        self._subs[sub.id] = sub
        self._save()
        return sub, True

    def confirm(self, topic_arn: str, token: str) -> Subscription | None:
        for sub in self._subs.values():
            if sub.topic_arn == topic_arn and secrets.compare_digest(sub.token, token):
                confirmed = replace(sub, status="confirmed")
                self._subs[sub.id] = confirmed
                self._save()
                return confirmed
        return None

    def delete(self, sub_id: str) -> bool:
        if self._subs.pop(sub_id, None) is None:
            return False
        self._save()
        return True

    def delete_by_arn(self, arn: str) -> bool:
        for sub in list(self._subs.values()):
            if sub.arn == arn:
                return self.delete(sub.id)
        return False

    def _save(self) -> None:
        save_json(self.path, [asdict(s) for s in self._subs.values()])
