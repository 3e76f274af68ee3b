"""AWS End User Messaging SMS notifications (the `Message` of a verified SNS notification) →
`ses_event` records, one per notification. Pure.

Two shapes reach the webhook, both JSON objects:

- a configuration set's event destination: `eventType` `TEXT_*`, `messageId`,
  `destinationPhoneNumber`, `eventTimestamp` (epoch ms), `messageStatus`,
  `messageStatusDescription`, `isFinal`, and `context`, the map given to SendTextMessage (ours:
  `campaign`, `seq`, maybe `variant`);
- two-way messaging (a reply to our number): `originationNumber` (the recipient who replied),
  `destinationNumber` (our number), `messageKeyword`, `messageBody`, `inboundMessageId`; no
  event type and no time (the record takes the time the webhook received it).

They share the `ses_event` contract with SES's events: the fields mean the same with the
channel's words (`recipient` is the normalised E.164 number, `ses_message_id` the provider's
message id, `tags` the context), and `source` (`sms_event_destination` | `sms_two_way`) tells
them apart (streams.rules.sms_feedback). A reply keeps its first 500 characters in `detail` (what
the opt-out decision reads) and the keyword AWS matched in `tags.keyword`.

The event id is the SES path's: a uuid5 of (message id, event type, number), so a redelivered
notification maps to the same id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from producers.ses_events import MAX_DETAIL, VERSION, SesEventInvalid, event_id, int_tag
from streams.rules.phones import normalise_phone, phone_problem
from streams.rules.sms_feedback import INBOUND, SMS_EVENT_DESTINATION, SMS_TWO_WAY

TEXT_PREFIX = "TEXT_"
MAX_CONTEXT = 5  # SendTextMessage's Context holds at most five entries


def is_sms_data(data: Mapping[str, Any]) -> bool:
    """An SMS notification rather than an SES event (which has `mail`)."""
    event_type = data.get("eventType")
    if isinstance(event_type, str):
        return event_type.startswith(TEXT_PREFIX)
    return "inboundMessageId" in data


def parse_sms_data(
    data: Mapping[str, Any], *, sns_message_id: str, received_at_ms: int
) -> list[dict[str, Any]]:
    """The one record of an SMS notification (`is_sms_data`), or SesEventInvalid."""
    if isinstance(data.get("eventType"), str):
        return [_text_event(data, sns_message_id, received_at_ms)]
    return [_inbound(data, sns_message_id, received_at_ms)]


def _number(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise SesEventInvalid("no_phone_number", field)
    number = normalise_phone(value)
    problem = phone_problem(number)
    if problem is not None:
        raise SesEventInvalid("bad_phone_number", f"{field}: {problem}")
    return number


def _id(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 200:
        raise SesEventInvalid("no_message_id", field)
    return value


def _epoch_ms(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _record(
    event_type: str, message_id: str, number: str, sns_message_id: str, received_at_ms: int
) -> dict[str, Any]:
    return {
        "event_id": event_id(message_id, event_type, number),
        "event_type": event_type,
        "version": VERSION,
        "occurred_at": received_at_ms,
        "recipient": number,
        "ses_message_id": message_id,
        "sns_message_id": sns_message_id,
        "campaign_id": None,
        "seq": None,
        "configuration_set": None,
        "tags": {},
        "bounce_type": None,
        "bounce_sub_type": None,
        "complaint_type": None,
        "detail": None,
        "received_at": received_at_ms,
    }


def _text_event(
    data: Mapping[str, Any], sns_message_id: str, received_at_ms: int
) -> dict[str, Any]:
    event_type = str(data["eventType"])
    if len(event_type) > 64:
        raise SesEventInvalid("no_event_type", event_type[:64])
    message_id = _id(data.get("messageId"), f"{event_type} messageId")
    number = _number(data.get("destinationPhoneNumber"), f"{event_type} destinationPhoneNumber")
    raw_context = data.get("context")
    context = {
        str(k)[:100]: v[:100]
        for k, v in (raw_context.items() if isinstance(raw_context, dict) else ())
        if isinstance(v, str)
    }
    context = dict(list(context.items())[:MAX_CONTEXT])
    status = " ".join(
        str(data[k]) for k in ("messageStatus", "messageStatusDescription") if data.get(k)
    )
    configuration_set = data.get("configurationSetName")
    return {
        **_record(event_type, message_id, number, sns_message_id, received_at_ms),
        "occurred_at": _epoch_ms(data.get("eventTimestamp")) or received_at_ms,
        "campaign_id": int_tag(context, "campaign"),
        "seq": int_tag(context, "seq"),
        "configuration_set": (
            configuration_set[:100]
            if isinstance(configuration_set, str) and configuration_set
            else None
        ),
        "tags": context,
        "detail": status[:MAX_DETAIL] or None,
        "source": SMS_EVENT_DESTINATION,
    }


def _inbound(data: Mapping[str, Any], sns_message_id: str, received_at_ms: int) -> dict[str, Any]:
    message_id = _id(data.get("inboundMessageId"), "inboundMessageId")
    number = _number(data.get("originationNumber"), "originationNumber")
    tags: dict[str, str] = {}
    for key, field in (("keyword", "messageKeyword"), ("to", "destinationNumber")):
        value = data.get(field)
        if isinstance(value, str) and value:
            tags[key] = value[:100]
    body = data.get("messageBody")
    text = body.strip()[:MAX_DETAIL] if isinstance(body, str) else ""
    return {
        **_record(INBOUND, message_id, number, sns_message_id, received_at_ms),
        "tags": tags,
        "detail": text or None,
        "source": SMS_TWO_WAY,
    }
