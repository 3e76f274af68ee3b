"""What an answer to one Publish to a platform endpoint means for that device (pure).

The rule is SMS's (streams.rules.sms_outcomes) applied per device: RETRY only when SNS certainly did
not publish (Throttling, a connection refused before the request left); UNKNOWN whenever it
might have (read timeout, dropped connection, 5xx); PAUSE when the account or the platform
application cannot publish at all (every other device would fail the same way); DISABLED when
the endpoint cannot take notifications (EndpointDisabled: the platform invalidated its token;
NotFound: it was deleted): nothing was sent, and the endpoint is disabled in our table; FAILED
for any other refusal. Codes are those of botocore's `sns` model; SNS answers a publish rate
beyond the account's quota with `Throttling` (HTTP 400).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from streams.rules.outcomes import CONNECT_ERROR


class DeviceOutcome(StrEnum):
    SENT = "sent"
    FAILED = "failed"
    DISABLED = "disabled"
    RETRY = "retry"
    UNKNOWN = "unknown"
    PAUSE_CAMPAIGN = "pause_campaign"


@dataclass(frozen=True, slots=True)
class DeviceVerdict:
    outcome: DeviceOutcome
    reason: str
    throttled: bool = False


_THROTTLES = frozenset({"Throttling", "Throttled", "ThrottlingException", "KMSThrottling"})
_PAUSE_CODES = frozenset(
    {
        "PlatformApplicationDisabled",
        "AuthorizationError",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "KMSDisabled",
        "KMSAccessDenied",
        "KMSNotFound",
        "KMSInvalidState",
        "KMSOptInRequired",
    }
)
DISABLED_CODES = {"EndpointDisabled": "endpoint_disabled", "NotFound": "endpoint_not_found"}


def classify_publish_error(
    code: str | None, http_status: int | None, *, timed_out: bool
) -> DeviceVerdict:
    """The verdict for a Publish that raised instead of returning a MessageId."""
    why = code or "no_response"
    if timed_out:
        return DeviceVerdict(DeviceOutcome.UNKNOWN, why)
    if code in _THROTTLES or http_status == 429:
        return DeviceVerdict(DeviceOutcome.RETRY, why, throttled=True)
    if http_status is None:
        outcome = DeviceOutcome.RETRY if code == CONNECT_ERROR else DeviceOutcome.UNKNOWN
        return DeviceVerdict(outcome, why)
    if http_status >= 500:
        return DeviceVerdict(DeviceOutcome.UNKNOWN, why)
    if code in DISABLED_CODES:
        return DeviceVerdict(DeviceOutcome.DISABLED, DISABLED_CODES[code])
    if code in _PAUSE_CODES or http_status in (401, 403):
        return DeviceVerdict(DeviceOutcome.PAUSE_CAMPAIGN, why)
    return DeviceVerdict(DeviceOutcome.FAILED, why)
