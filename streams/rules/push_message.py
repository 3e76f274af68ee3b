"""A push notification as SNS's Publish takes it (pure): MessageStructure=json, one key per
platform, each a JSON string of that platform's own payload.

- `GCM` (Firebase Cloud Messaging, SNS's platform name): `notification` (title, body),
  `data` (our campaign and seq: they come back in the platform's receipt), `time_to_live`
  (seconds) and `collapse_key` from the campaign;
- `APNS`: `aps.alert` (title, body), our campaign and seq as custom keys; the lifetime and
  collapse id travel as SNS message attributes (`AWS.SNS.MOBILE.APNS.TTL`,
  `AWS.SNS.MOBILE.APNS.COLLAPSE_ID`), which SNS turns into the apns-expiration and
  apns-collapse-id headers;
- `default`: the body, for any other platform.

The body is the campaign's template rendered with the user's variables exactly as an SMS
body is (streams.rules.sms_text.render_body).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from streams.rules.sms_text import render_body

MAX_DEVICES = 10  # a push row takes its user's most recently seen endpoints, at most this many
APNS_TTL = "AWS.SNS.MOBILE.APNS.TTL"
APNS_COLLAPSE_ID = "AWS.SNS.MOBILE.APNS.COLLAPSE_ID"
FCM_TTL = "AWS.SNS.MOBILE.FCM.TTL"


@dataclass(frozen=True, slots=True)
class PushContent:
    title: str
    template: str
    ttl_s: int | None  # None: the platform's default lifetime
    collapse_key: str | None


def build_message(
    content: PushContent, values: dict[str, Any], context: dict[str, str], platform: str
) -> tuple[str, dict[str, str]]:
    """(the Message JSON, the message attributes) of one notification to one endpoint of
    `platform` (FCM or APNS)."""
    body = render_body(content.template, values)
    title = render_body(content.title, values)
    attributes: dict[str, str] = {}
    doc: dict[str, str] = {"default": body}
    if platform == "APNS":
        aps: dict[str, Any] = {"alert": {"title": title, "body": body}}
        doc["APNS"] = json.dumps({"aps": aps, **context}, separators=(",", ":"))
        if content.ttl_s is not None:
            attributes[APNS_TTL] = str(content.ttl_s)
        if content.collapse_key:
            attributes[APNS_COLLAPSE_ID] = content.collapse_key[:64]
    else:
        fcm: dict[str, Any] = {"notification": {"title": title, "body": body}, "data": context}
        if content.ttl_s is not None:
            fcm["time_to_live"] = content.ttl_s
            attributes[FCM_TTL] = str(content.ttl_s)
        if content.collapse_key:
            fcm["collapse_key"] = content.collapse_key
        doc["GCM"] = json.dumps(fcm, separators=(",", ":"))
    return json.dumps(doc, separators=(",", ":")), attributes


def endpoint_ids(address: str) -> list[int]:
    """The enabled endpoints' ids a push row's address holds (the snapshot writes them
    comma-separated, a disabled one prefixed `d`)."""
    return [int(part) for part in address.split(",") if part.isdigit()]


def disabled_ids(address: str) -> list[int]:
    """The ids of the endpoints that were disabled at the snapshot (`d<id>`)."""
    return [int(part[1:]) for part in address.split(",") if part[:1] == "d" and part[1:].isdigit()]
