"""SES event JSON (the `Message` of a verified SNS notification) → one record per recipient.

Pure. Two shapes reach the webhook:

- event publishing (a configuration set's event destination): `eventType`, and `mail.tags`
  carrying our tags (`{"campaign": ["42"], "seq": ["1234"]}`) plus SES's own `ses:*` tags;
- identity feedback notifications: `notificationType`, no tags.

Why one record per recipient: the Kafka key is the recipient (all of an address's events on one
partition, in order), and suppression is per address. Why a deterministic `event_id`: SNS
delivers at least once, and the same SES event must count once however often it arrives; the
id is a uuid5 of (SES message id, event type, recipient), so a redelivered POST — even with a
new SNS MessageId from another topic — maps to the same id.

`SesEventInvalid` means an authentic message that is not an SES event we can read: retrying
will not help, so the webhook dead-letters it and answers 200.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from datetime import datetime
from email.utils import parseaddr
from typing import Any

from flashsend.errors import FlashsendError
from streams.rules.addresses import normalise_email

SCHEMA = "ses_event"
VERSION = 1
EVENT_NAMESPACE = uuid.UUID("6f1c9a52-4a8e-4d43-9d1b-5e3f0c2b7a10")
MAX_DETAIL = 500
MAX_RECIPIENTS = 1000  # more than any SES message can have (50 destinations)

# Where each event type keeps its timestamp and its recipients (else mail.destination).
_DETAIL_KEY = {
    "Bounce": "bounce",
    "Complaint": "complaint",
    "Delivery": "delivery",
    "DeliveryDelay": "deliveryDelay",
    "Reject": "reject",
    "Rendering Failure": "failure",
    "Send": "send",
    "Open": "open",
    "Click": "click",
    "Subscription": "subscription",
}


class SesEventInvalid(FlashsendError):
    """The notification is not an SES event this webhook can read."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail[:200]}" if detail else reason)


_NAMESPACE_BYTES = EVENT_NAMESPACE.bytes


def event_id(ses_message_id: str, event_type: str, recipient: str) -> str:
    """`str(uuid.uuid5(EVENT_NAMESPACE, "<message id>/<type>/<recipient>"))`, without building
    a UUID object (it runs for every event the webhook takes in)."""
    name = f"{ses_message_id}/{event_type}/{recipient}".encode()
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + name, usedforsecurity=False).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def parse_timestamp_ms(value: Any) -> int | None:
    """SES's ISO-8601 timestamps (`2026-05-08T12:00:05.123Z`) → epoch ms; None if absent/bad."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


def _address(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    bare = parseaddr(value)[1] if "<" in value else value
    return normalise_email(bare) or None


def _recipients(event_type: str, detail: Mapping[str, Any], mail: Mapping[str, Any]) -> list[str]:
    if event_type == "Bounce":
        raw = [r.get("emailAddress") for r in _dicts(detail.get("bouncedRecipients"))]
    elif event_type == "Complaint":
        raw = [r.get("emailAddress") for r in _dicts(detail.get("complainedRecipients"))]
    elif event_type == "DeliveryDelay":
        raw = [r.get("emailAddress") for r in _dicts(detail.get("delayedRecipients"))]
    elif event_type == "Delivery" and isinstance(detail.get("recipients"), list):
        raw = list(detail["recipients"])
    else:
        raw = list(mail.get("destination") or [])
    seen: dict[str, None] = {}
    for item in raw[:MAX_RECIPIENTS]:
        address = _address(item)
        if address:
            seen.setdefault(address, None)
    return list(seen)


def _dicts(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _first_values(tags: Any) -> dict[str, str]:
    """mail.tags maps a name to a list of values; keep the first (ours have exactly one)."""
    out: dict[str, str] = {}
    if not isinstance(tags, dict):
        return out
    for name, values in tags.items():
        if isinstance(values, list) and values and isinstance(values[0], str):
            out[str(name)] = values[0]
        elif isinstance(values, str):
            out[str(name)] = values
    return out


def int_tag(tags: Mapping[str, str], name: str) -> int | None:
    value = tags.get(name, "")
    return int(value) if value.isdigit() and len(value) < 19 else None


def _detail_text(event_type: str, detail: Mapping[str, Any], recipient: str) -> str | None:
    if event_type in ("Bounce", "DeliveryDelay"):
        key = "bouncedRecipients" if event_type == "Bounce" else "delayedRecipients"
        for r in _dicts(detail.get(key)):
            if _address(r.get("emailAddress")) == recipient:
                parts = [str(r[k]) for k in ("status", "diagnosticCode") if r.get(k)]
                return " ".join(parts)[:MAX_DETAIL] or None
        return None
    if event_type == "Delivery":
        return str(detail.get("smtpResponse") or "")[:MAX_DETAIL] or None
    if event_type == "Reject":
        return str(detail.get("reason") or "")[:MAX_DETAIL] or None
    if event_type == "Rendering Failure":
        return str(detail.get("errorMessage") or "")[:MAX_DETAIL] or None
    return None


def parse_ses_message(
    message: str, *, sns_message_id: str, received_at_ms: int
) -> list[dict[str, Any]]:
    """Records ready for `AvroCodec("ses_event").encode`, one per recipient, in order."""
    return parse_ses_data(
        decode_message(message), sns_message_id=sns_message_id, received_at_ms=received_at_ms
    )


def decode_message(message: str) -> dict[str, Any]:
    """The JSON object in an SNS notification's `Message`, or SesEventInvalid."""
    try:
        data = json.loads(message)
    except (ValueError, RecursionError) as exc:
        raise SesEventInvalid("not_json", str(exc)) from None
    if not isinstance(data, dict):
        raise SesEventInvalid("not_an_object")
    return data


def parse_ses_data(
    data: Mapping[str, Any], *, sns_message_id: str, received_at_ms: int
) -> list[dict[str, Any]]:
    """`parse_ses_message` of an already decoded JSON object."""
    event_type = data.get("eventType")
    source = "event_publishing"
    if not isinstance(event_type, str):
        event_type, source = data.get("notificationType"), "notification"
    if not isinstance(event_type, str) or not event_type or len(event_type) > 64:
        raise SesEventInvalid("no_event_type")
    mail = data.get("mail")
    if not isinstance(mail, dict):
        raise SesEventInvalid("no_mail", event_type)
    ses_message_id = mail.get("messageId")
    if not isinstance(ses_message_id, str) or not ses_message_id:
        raise SesEventInvalid("no_message_id", event_type)
    detail_key = _DETAIL_KEY.get(event_type, event_type[:1].lower() + event_type[1:])
    detail = data.get(detail_key)
    detail = detail if isinstance(detail, dict) else {}
    recipients = _recipients(event_type, detail, mail)
    if not recipients:
        raise SesEventInvalid("no_recipients", f"{event_type} {ses_message_id}")
    all_tags = _first_values(mail.get("tags"))
    ours = {k: v for k, v in all_tags.items() if not k.startswith("ses:")}
    occurred = (
        parse_timestamp_ms(detail.get("timestamp"))
        or parse_timestamp_ms(mail.get("timestamp"))
        or received_at_ms
    )
    common = {
        "event_type": event_type,
        "version": VERSION,
        "occurred_at": occurred,
        "ses_message_id": ses_message_id,
        "sns_message_id": sns_message_id,
        "campaign_id": int_tag(ours, "campaign"),
        "seq": int_tag(ours, "seq"),
        "configuration_set": all_tags.get("ses:configuration-set"),
        "tags": ours,
        "bounce_type": _str_or_none(detail.get("bounceType")) if event_type == "Bounce" else None,
        "bounce_sub_type": (
            _str_or_none(detail.get("bounceSubType")) if event_type == "Bounce" else None
        ),
        "complaint_type": (
            _str_or_none(detail.get("complaintFeedbackType")) if event_type == "Complaint" else None
        ),
        "source": source,
        "received_at": received_at_ms,
    }
    return [
        {
            **common,
            "event_id": event_id(ses_message_id, event_type, recipient),
            "recipient": recipient,
            "detail": _detail_text(event_type, detail, recipient),
        }
        for recipient in recipients
    ]


def _str_or_none(value: Any) -> str | None:
    return value[:100] if isinstance(value, str) and value else None
