"""What an SES answer means for each recipient: sent, failed, retry, unknown or pause.

Why this is its own pure module: the sender's correctness rests on one distinction, "did SES
possibly accept this request?". Marketing is at-most-once (SES has no idempotency key), so:

- RETRY only when SES certainly did not act on the request (throttle answers, a connection that
  was refused before anything was sent, per-entry TRANSIENT_FAILURE / ACCOUNT_THROTTLED).
- UNKNOWN whenever it might have: read timeouts, dropped connections, 5xx. Terminal; resolved
  later from SES Send/Delivery events, never by sending again.
- PAUSE_CAMPAIGN when the account or configuration set cannot send at all right now (quota,
  paused, suspended, credentials): the recipient goes back to pending and the campaign pauses
  with the reason, instead of failing a million rows one batch at a time.
- FAILED when SES answered and refused this recipient. A call SES refused whole before sending
  any of it (`is_refused_unsent`) is split to find which entries it refused
  (streams.rules.call_split), so one bad address fails only itself.

Per-entry statuses come from the botocore model of SESv2 SendBulkEmail; AWS's HTML docs spell
two of them `*_DOES_NOT_EXIST`, so both spellings are accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    SENT = "sent"
    FAILED = "failed"
    RETRY = "retry"
    UNKNOWN = "unknown"
    PAUSE_CAMPAIGN = "pause_campaign"


_ENTRY_OUTCOMES: dict[str, Outcome] = {
    "SUCCESS": Outcome.SENT,
    "TRANSIENT_FAILURE": Outcome.RETRY,
    "ACCOUNT_THROTTLED": Outcome.RETRY,
    "ACCOUNT_DAILY_QUOTA_EXCEEDED": Outcome.PAUSE_CAMPAIGN,
    "ACCOUNT_SENDING_PAUSED": Outcome.PAUSE_CAMPAIGN,
    "CONFIGURATION_SET_SENDING_PAUSED": Outcome.PAUSE_CAMPAIGN,
    "ACCOUNT_SUSPENDED": Outcome.PAUSE_CAMPAIGN,
    "MESSAGE_REJECTED": Outcome.FAILED,
    "MAIL_FROM_DOMAIN_NOT_VERIFIED": Outcome.FAILED,
    "CONFIGURATION_SET_NOT_FOUND": Outcome.FAILED,
    "CONFIGURATION_SET_DOES_NOT_EXIST": Outcome.FAILED,
    "TEMPLATE_NOT_FOUND": Outcome.FAILED,
    "TEMPLATE_DOES_NOT_EXIST": Outcome.FAILED,
    "INVALID_SENDING_POOL_NAME": Outcome.FAILED,
    "INVALID_PARAMETER": Outcome.FAILED,
    "FAILED": Outcome.FAILED,
}

# Statuses and call-level codes that say the campaign's configuration is broken: every other
# entry will fail the same way, so the sender pauses the campaign with this reason.
_CAMPAIGN_FATAL = frozenset(
    {
        "MAIL_FROM_DOMAIN_NOT_VERIFIED",
        "CONFIGURATION_SET_NOT_FOUND",
        "CONFIGURATION_SET_DOES_NOT_EXIST",
        "TEMPLATE_NOT_FOUND",
        "TEMPLATE_DOES_NOT_EXIST",
        "INVALID_SENDING_POOL_NAME",
        "MailFromDomainNotVerifiedException",
        "NotFoundException",
    }
)

_THROTTLE_CODES = frozenset(
    {"TooManyRequestsException", "LimitExceededException", "Throttling", "ThrottlingException"}
)

# The adapter reports a connection that failed before the request left with this code.
CONNECT_ERROR = "ConnectError"

# Call-level codes that stop the whole account or configuration set, and credential errors:
# SES did not process the request, and retrying batch after batch would not help.
_PAUSE_CODES = frozenset(
    {
        "AccountSuspendedException",
        "SendingPausedException",
        "AccessDeniedException",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "ExpiredTokenException",
        "InvalidSignatureException",
        "SignatureDoesNotMatch",
    }
)


# Call-level errors that refuse a request SES validated and did not send, and that one entry
# can cause, so splitting the call isolates it (streams.rules.call_split). botocore's SESv2 model
# lists for SendBulkEmail: TooManyRequests (429), LimitExceeded, AccountSuspended, SendingPaused,
# MailFromDomainNotVerified, NotFound (404), MessageRejected and BadRequest (400). The first six
# are about the account, the rate or the campaign's configuration, the same for every entry;
# BadRequest ("the input you provided is invalid": an address SES cannot use) and
# MessageRejected (content or, in the sandbox, an unverified recipient) can be one entry's.
# InvalidParameterValue and ValidationException are the same refusal in SES v1's and AWS's
# generic spelling. An error answer to SendBulkEmail carries no per-entry results: SES acted on
# none of the entries.
_REFUSED_UNSENT = frozenset(
    {"BadRequestException", "MessageRejected", "InvalidParameterValue", "ValidationException"}
)


def _normalise_status(status: str) -> str:
    return status.strip().upper()


def classify_entry_status(status: str) -> Outcome:
    """Outcome of one per-entry status of a SendBulkEmail response.

    An unrecognised status is FAILED, never RETRY: SES answered for this entry and did not say
    SUCCESS, and resending something we do not understand risks a duplicate. Keep the raw status
    as the reason (see `map_bulk_response`).
    """
    return _ENTRY_OUTCOMES.get(_normalise_status(status), Outcome.FAILED)


def is_campaign_fatal(status_or_code: str) -> bool:
    """True when this per-entry status or call-level error code breaks the whole campaign.

    These classify as FAILED for the entries at hand (SES refused them), but the caller must
    also pause the campaign with this reason: a missing template or unverified MAIL FROM domain
    would otherwise fail every remaining row. PAUSE_CAMPAIGN outcomes already imply a pause.
    """
    raw = status_or_code.strip()
    return raw in _CAMPAIGN_FATAL or _normalise_status(raw) in _CAMPAIGN_FATAL


def is_throttle(code: str | None, http_status: int | None) -> bool:
    """True for SES call-level throttling: HTTP 429 or one of the throttling error codes."""
    return http_status == 429 or (code is not None and code in _THROTTLE_CODES)


def is_entry_throttle(status: str) -> bool:
    """True for the per-entry throttle status, which should slow the sender down like a 429."""
    return _normalise_status(status) == "ACCOUNT_THROTTLED"


def classify_call_error(code: str | None, http_status: int | None, *, timed_out: bool) -> Outcome:
    """Outcome for every entry of a SendBulkEmail call that raised instead of answering.

    `timed_out` means the request was (or may have been) sent and no complete answer came back:
    a read timeout or a connection dropped mid-call. `code` is the AWS error code (or
    `CONNECT_ERROR` for a connection refused before sending); `http_status` the HTTP status if a
    response arrived. The order of the checks matters: a request that may have reached SES is
    UNKNOWN whatever else is known about it.
    """
    if timed_out:
        return Outcome.UNKNOWN
    if is_throttle(code, http_status):
        return Outcome.RETRY  # SES rejects throttled calls before processing any entry
    if http_status is None:
        # No HTTP answer: safe to retry only if we know the request never left.
        return Outcome.RETRY if code == CONNECT_ERROR else Outcome.UNKNOWN
    if http_status >= 500:
        return Outcome.UNKNOWN  # SES may have sent some or all entries before failing
    if code in _PAUSE_CODES or http_status in (401, 403):
        return Outcome.PAUSE_CAMPAIGN
    if http_status == 408:
        return Outcome.RETRY  # the server gave up waiting for the request: not processed
    if 400 <= http_status < 500:
        return Outcome.FAILED  # validation errors: SES answered and refused the call
    return Outcome.UNKNOWN  # an error with a 1xx-3xx status is not something we understand


def is_refused_unsent(code: str | None, http_status: int | None) -> bool:
    """True when SES refused a whole call with an error that means nothing of it was sent and
    that one entry may have caused: the caller may split the call and send the halves again."""
    return http_status == 400 and code in _REFUSED_UNSENT


@dataclass(frozen=True)
class EntryResult:
    """The outcome for one recipient, identified by its campaign `seq`."""

    seq: int
    outcome: Outcome
    reason: str | None
    message_id: str | None


def _reason(status: str, error: str | None) -> str:
    return f"{status}: {error}" if error else status


def map_bulk_response(
    seqs: Sequence[int], entry_statuses: Sequence[tuple[str, str | None, str | None]]
) -> list[EntryResult]:
    """Pair a SendBulkEmail response with the recipients of the request.

    `entry_statuses` are `(Status, MessageId, Error)` in the order SES returned them, which is
    request order. If the lengths differ we cannot tell which entry is whose, and some of them
    were probably sent, so every recipient becomes UNKNOWN rather than guessing.
    """
    if len(seqs) != len(entry_statuses):
        return [EntryResult(seq, Outcome.UNKNOWN, "response length mismatch", None) for seq in seqs]
    results = []
    for seq, (status, message_id, error) in zip(seqs, entry_statuses, strict=True):
        outcome = classify_entry_status(status)
        reason = None if outcome is Outcome.SENT else _reason(status, error)
        results.append(EntryResult(seq, outcome, reason, message_id))
    return results
