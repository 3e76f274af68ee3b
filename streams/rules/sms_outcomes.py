"""What an answer to one SendTextMessage means for its recipient (pure).

SMS has no idempotency key either, and one message is one call, so the rule is the email
channel's (streams.rules.outcomes) applied per message: RETRY only when the provider certainly did
not act (a throttle, a connection refused before the request left); UNKNOWN whenever it might
have (read timeout, dropped connection, 5xx); PAUSE when the account, the origination identity
or the configuration set cannot send at all (every other message would fail the same way:
monthly spend limit, account disabled, a missing resource, credentials); SKIPPED when the
number opted out at the provider (nothing was sent, and nothing should be); FAILED for any
other refusal of this message. Error codes and reasons are those of botocore's
`pinpoint-sms-voice-v2` model.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from streams.rules.outcomes import CONNECT_ERROR


class TextOutcome(StrEnum):
    SENT = "sent"
    FAILED = "failed"
    SKIPPED = "skipped"
    RETRY = "retry"
    UNKNOWN = "unknown"
    PAUSE_CAMPAIGN = "pause_campaign"


@dataclass(frozen=True, slots=True)
class TextVerdict:
    outcome: TextOutcome
    reason: str
    throttled: bool = False


_THROTTLES = frozenset({"ThrottlingException", "TooManyRequestsException", "Throttling"})
# The whole account or the campaign's configuration cannot send: pause, do not fail rows.
_PAUSE_CODES = frozenset(
    {
        "AccessDeniedException",
        "ResourceNotFoundException",
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "ExpiredTokenException",
    }
)
OPTED_OUT = "DESTINATION_PHONE_NUMBER_OPTED_OUT"


def classify_text_error(
    code: str | None, http_status: int | None, reason: str | None, *, timed_out: bool
) -> TextVerdict:
    """The verdict for a SendTextMessage that raised instead of returning a MessageId.
    `reason` is the exception's `Reason` member when the model has one."""
    why = f"{code or 'no_response'}:{reason}" if reason else f"{code or 'no_response'}"
    if timed_out:
        return TextVerdict(TextOutcome.UNKNOWN, why)
    if code in _THROTTLES or http_status == 429:
        return TextVerdict(TextOutcome.RETRY, why, throttled=True)
    if http_status is None:
        return TextVerdict(TextOutcome.RETRY if code == CONNECT_ERROR else TextOutcome.UNKNOWN, why)
    if http_status >= 500:
        return TextVerdict(TextOutcome.UNKNOWN, why)
    if code == "ServiceQuotaExceededException" or code in _PAUSE_CODES:
        return TextVerdict(TextOutcome.PAUSE_CAMPAIGN, why)
    if http_status in (401, 403):
        return TextVerdict(TextOutcome.PAUSE_CAMPAIGN, why)
    if code == "ConflictException" and reason == OPTED_OUT:
        return TextVerdict(TextOutcome.SKIPPED, "opted_out_at_provider")
    if 400 <= http_status < 500:
        return TextVerdict(TextOutcome.FAILED, why)
    return TextVerdict(TextOutcome.UNKNOWN, why)
