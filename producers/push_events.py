"""SNS mobile push delivery-status events (the `Message` of a verified SNS notification from
a platform application's `EventDeliveryFailure` topic) → `ses_event` records. Pure.

The shape SNS publishes ("Mobile push application event notifications"): `EventType`
(`DeliveryFailure`), `EndpointArn`, `FailureType` (e.g. `InvalidPlatformToken`,
`EndpointDisabled`), `FailureMessage`, `MessageId`, `Resource` (the application ARN),
`Service` (`SNS`), `Time` (ISO 8601). It shares the `ses_event` contract with SES's and SMS's
events: `recipient` is the endpoint ARN (the device's address on this channel),
`ses_message_id` the publish's MessageId, `event_type` `Push<EventType>`, `detail` the failure
type and message, `source` `push_platform` (streams.rules.push_feedback). The event id is the SES
path's: a uuid5 of (message id, event type, endpoint), so a redelivery maps to the same id.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from producers.ses_events import MAX_DETAIL, VERSION, SesEventInvalid, event_id
from streams.rules.push_feedback import PUSH_EVENT_PREFIX, PUSH_PLATFORM

ENDPOINT_MARK = ":endpoint/"


def is_push_data(data: Mapping[str, Any]) -> bool:
    """A push application event rather than an SES or SMS event."""
    return data.get("Service") == "SNS" and isinstance(data.get("EndpointArn"), str)


def _epoch_ms(value: Any) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


def parse_push_data(
    data: Mapping[str, Any], *, sns_message_id: str, received_at_ms: int
) -> list[dict[str, Any]]:
    """The one record of a push application event (`is_push_data`), or SesEventInvalid."""
    arn = str(data["EndpointArn"])
    if ENDPOINT_MARK not in arn or not arn.startswith("arn:") or len(arn) > 512:
        raise SesEventInvalid("bad_endpoint_arn", arn[:100])
    kind = data.get("EventType")
    if not isinstance(kind, str) or not kind or len(kind) > 60:
        raise SesEventInvalid("no_event_type", "EventType")
    message_id = data.get("MessageId")
    if not isinstance(message_id, str) or not message_id or len(message_id) > 200:
        message_id = sns_message_id  # an EndpointUpdated event names no publish
    event_type = PUSH_EVENT_PREFIX + kind
    detail = " ".join(str(data[k]) for k in ("FailureType", "FailureMessage") if data.get(k))
    return [
        {
            "event_id": event_id(message_id, event_type, arn),
            "event_type": event_type,
            "version": VERSION,
            "occurred_at": _epoch_ms(data.get("Time")) or received_at_ms,
            "recipient": arn,
            "ses_message_id": message_id,
            "sns_message_id": sns_message_id,
            "campaign_id": None,
            "seq": None,
            "configuration_set": None,
            "tags": {},
            "bounce_type": None,
            "bounce_sub_type": None,
            "complaint_type": None,
            "detail": detail[:MAX_DETAIL] or None,
            "received_at": received_at_ms,
            "source": PUSH_PLATFORM,
        }
    ]
