"""The TEXT_* event AWS End User Messaging SMS publishes for an accepted message (pure).

The fields of the service's documented SMS event ("Messaging events", sms-voice user guide);
`context` is the map given to SendTextMessage, so our `campaign` and `seq` come back. The
stand-in delivers every message: one final TEXT_DELIVERED event per message, right away.
"""

from __future__ import annotations

from typing import Any

from infra.ses_standin.sms import SmsRecord

TEXT_DELIVERED = "TEXT_DELIVERED"
# What the stand-in may publish; subscriptions filter on them like on SES event types.
TEXT_EVENT_TYPES = (
    "TEXT_DELIVERED",
    "TEXT_SUCCESSFUL",
    "TEXT_QUEUED",
    "TEXT_PENDING",
    "TEXT_BLOCKED",
    "TEXT_TTL_EXPIRED",
    "TEXT_CARRIER_UNREACHABLE",
    "TEXT_INVALID",
    "TEXT_INVALID_MESSAGE",
    "TEXT_CARRIER_BLOCKED",
    "TEXT_UNREACHABLE",
    "TEXT_SPAM",
    "TEXT_UNKNOWN",
    "TEXT_PROTECT_BLOCKED",
)
_STATUS = {"TEXT_DELIVERED": ("DELIVERED", "Message has been accepted by phone")}


def text_event(record: SmsRecord, event_type: str, now_ms: int) -> dict[str, Any]:
    status, description = _STATUS.get(event_type, (event_type.removeprefix("TEXT_"), ""))
    return {
        "eventType": event_type,
        "eventVersion": "1.0",
        "eventTimestamp": now_ms,
        "isFinal": True,
        "originationPhoneNumber": record.origination_identity,
        "destinationPhoneNumber": record.destination,
        "isInternationalSend": False,
        "messageId": record.message_id,
        "messageRequestTimestamp": int(record.at * 1000),
        "messageEncoding": "GSM",
        "messageType": "PROMOTIONAL",
        "messageStatus": status,
        "messageStatusDescription": description,
        "context": dict(record.context),
        "totalMessageParts": record.segments,
    }
