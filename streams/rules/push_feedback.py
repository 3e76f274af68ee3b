"""What a push application event means for us (pure): a device whose token is dead.

SNS publishes a `DeliveryFailure` event to the platform application's EventDeliveryFailure
topic when the platform (FCM, APNs) refuses a notification; for a token the platform calls
invalid (`InvalidPlatformToken`, or an endpoint SNS already disabled for it) SNS disables the
endpoint. producers.push_events writes the event in the `ses_event` contract, the endpoint ARN
as its recipient. Its effect is a suppression of that ARN, reason `push_invalid_token`: the
suppression table's trigger (migration 0034) disables the endpoint in device_endpoints, so the
next snapshot leaves it out and a running campaign's channel skips it at its next call. Other
failures (a platform outage, a payload refused) count nowhere and disable nothing: the device
may take the next one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streams.rules.feedback_logic import FeedbackEffect

PUSH_PLATFORM = "push_platform"
PUSH_EVENT_PREFIX = "Push"
PUSH_INVALID_TOKEN = "push_invalid_token"
# FailureType values that mean the token will never take a notification again.
DEAD_TOKEN = ("InvalidPlatformToken", "EndpointDisabled", "Unregistered", "BadDeviceToken")


def is_push(record: Mapping[str, Any]) -> bool:
    return record.get("source") == PUSH_PLATFORM


def push_effect(record: Mapping[str, Any]) -> FeedbackEffect:
    """Effect of one decoded `ses_event` record that a push event became (`is_push`)."""
    detail = str(record.get("detail") or "")
    dead = detail.split(" ", 1)[0] in DEAD_TOKEN
    return FeedbackEffect(
        event_id=str(record["event_id"]),
        email=str(record["recipient"]),
        campaign_id=None,
        counter=None,
        suppress_reason=PUSH_INVALID_TOKEN if dead else None,
        source_event=f"{record['event_type']} {detail}"[:300],
    )
