"""Classification of SES SendBulkEmail results into recipient outcomes."""

from __future__ import annotations

import pytest

from streams.rules.outcomes import (
    CONNECT_ERROR,
    EntryResult,
    Outcome,
    classify_call_error,
    classify_entry_status,
    is_campaign_fatal,
    is_entry_throttle,
    is_refused_unsent,
    is_throttle,
    map_bulk_response,
)


@pytest.mark.parametrize(
    ("status", "outcome", "fatal"),
    [
        ("SUCCESS", Outcome.SENT, False),
        ("TRANSIENT_FAILURE", Outcome.RETRY, False),
        ("ACCOUNT_THROTTLED", Outcome.RETRY, False),
        ("ACCOUNT_DAILY_QUOTA_EXCEEDED", Outcome.PAUSE_CAMPAIGN, False),
        ("ACCOUNT_SENDING_PAUSED", Outcome.PAUSE_CAMPAIGN, False),
        ("CONFIGURATION_SET_SENDING_PAUSED", Outcome.PAUSE_CAMPAIGN, False),
        ("ACCOUNT_SUSPENDED", Outcome.PAUSE_CAMPAIGN, False),
        ("MESSAGE_REJECTED", Outcome.FAILED, False),
        ("INVALID_PARAMETER", Outcome.FAILED, False),
        ("FAILED", Outcome.FAILED, False),
        ("MAIL_FROM_DOMAIN_NOT_VERIFIED", Outcome.FAILED, True),
        ("CONFIGURATION_SET_NOT_FOUND", Outcome.FAILED, True),
        ("CONFIGURATION_SET_DOES_NOT_EXIST", Outcome.FAILED, True),
        ("TEMPLATE_NOT_FOUND", Outcome.FAILED, True),
        ("TEMPLATE_DOES_NOT_EXIST", Outcome.FAILED, True),
        ("INVALID_SENDING_POOL_NAME", Outcome.FAILED, True),
    ],
)
def test_every_entry_status(status: str, outcome: Outcome, fatal: bool) -> None:
    assert classify_entry_status(status) is outcome
    assert is_campaign_fatal(status) is fatal


def test_entry_throttle() -> None:
    assert is_entry_throttle("ACCOUNT_THROTTLED")
    assert not is_entry_throttle("TRANSIENT_FAILURE")
    assert not is_entry_throttle("ACCOUNT_DAILY_QUOTA_EXCEEDED")


def test_entry_status_tolerates_case_and_spaces() -> None:
    assert classify_entry_status(" success ") is Outcome.SENT
    assert classify_entry_status("transient_failure") is Outcome.RETRY
    assert is_campaign_fatal("template_not_found")


@pytest.mark.parametrize("status", ["", "SOMETHING_NEW", "PENDING"])
def test_unknown_entry_status_is_failed_not_retried(status: str) -> None:
    assert classify_entry_status(status) is Outcome.FAILED
    assert not is_campaign_fatal(status)


@pytest.mark.parametrize(
    ("code", "http_status", "timed_out", "outcome"),
    [
        # throttles: SES did not process the call
        ("TooManyRequestsException", 429, False, Outcome.RETRY),
        (None, 429, False, Outcome.RETRY),
        ("LimitExceededException", 400, False, Outcome.RETRY),
        ("Throttling", 400, False, Outcome.RETRY),
        ("ThrottlingException", 400, False, Outcome.RETRY),
        ("ThrottlingException", 503, False, Outcome.RETRY),
        # the request may have reached SES: never resend
        (None, None, True, Outcome.UNKNOWN),
        ("ReadTimeoutError", None, True, Outcome.UNKNOWN),
        ("TooManyRequestsException", 429, True, Outcome.UNKNOWN),
        ("ConnectionClosedError", None, False, Outcome.UNKNOWN),
        (None, None, False, Outcome.UNKNOWN),
        ("InternalFailure", 500, False, Outcome.UNKNOWN),
        ("ServiceUnavailable", 503, False, Outcome.UNKNOWN),
        (None, 502, False, Outcome.UNKNOWN),
        (None, 302, False, Outcome.UNKNOWN),
        # refused before anything was sent
        (CONNECT_ERROR, None, False, Outcome.RETRY),
        (None, 408, False, Outcome.RETRY),
        # SES answered and refused
        ("BadRequestException", 400, False, Outcome.FAILED),
        ("NotFoundException", 404, False, Outcome.FAILED),
        ("MessageRejected", 400, False, Outcome.FAILED),
        ("MailFromDomainNotVerifiedException", 400, False, Outcome.FAILED),
        (None, 400, False, Outcome.FAILED),
        # the account cannot send at all: put recipients back and pause
        ("AccountSuspendedException", 400, False, Outcome.PAUSE_CAMPAIGN),
        ("SendingPausedException", 400, False, Outcome.PAUSE_CAMPAIGN),
        ("AccessDeniedException", 403, False, Outcome.PAUSE_CAMPAIGN),
        ("ExpiredTokenException", 400, False, Outcome.PAUSE_CAMPAIGN),
        (None, 401, False, Outcome.PAUSE_CAMPAIGN),
    ],
)
def test_call_errors(
    code: str | None, http_status: int | None, timed_out: bool, outcome: Outcome
) -> None:
    assert classify_call_error(code, http_status, timed_out=timed_out) is outcome


def test_call_level_campaign_fatal_codes() -> None:
    assert is_campaign_fatal("NotFoundException")
    assert is_campaign_fatal("MailFromDomainNotVerifiedException")
    assert not is_campaign_fatal("BadRequestException")
    assert not is_campaign_fatal("MessageRejected")


@pytest.mark.parametrize(
    ("code", "http_status", "expected"),
    [
        # one entry may be the cause, and SES sent nothing: split the call
        ("BadRequestException", 400, True),
        ("MessageRejected", 400, True),
        ("InvalidParameterValue", 400, True),
        ("ValidationException", 400, True),
        # the same for every entry: splitting would only repeat it
        ("LimitExceededException", 400, False),
        ("AccountSuspendedException", 400, False),
        ("SendingPausedException", 400, False),
        ("MailFromDomainNotVerifiedException", 400, False),
        ("NotFoundException", 404, False),
        ("TooManyRequestsException", 429, False),
        # maybe sent: never again
        ("BadRequestException", 500, False),
        ("BadRequestException", None, False),
        (None, 400, False),
    ],
)
def test_is_refused_unsent(code: str | None, http_status: int | None, expected: bool) -> None:
    assert is_refused_unsent(code, http_status) is expected


@pytest.mark.parametrize(
    ("code", "http_status", "expected"),
    [
        ("TooManyRequestsException", 429, True),
        (None, 429, True),
        ("LimitExceededException", None, True),
        ("Throttling", 400, True),
        ("ThrottlingException", 400, True),
        ("BadRequestException", 400, False),
        (None, 503, False),
        (None, None, False),
    ],
)
def test_is_throttle(code: str | None, http_status: int | None, expected: bool) -> None:
    assert is_throttle(code, http_status) is expected


def test_map_bulk_response_pairs_in_request_order() -> None:
    results = map_bulk_response(
        [10, 11, 12, 13],
        [
            ("SUCCESS", "m-10", None),
            ("MESSAGE_REJECTED", None, "Email address is on the suppression list"),
            ("TRANSIENT_FAILURE", None, None),
            ("BRAND_NEW_STATUS", None, None),
        ],
    )
    assert results == [
        EntryResult(10, Outcome.SENT, None, "m-10"),
        EntryResult(
            11, Outcome.FAILED, "MESSAGE_REJECTED: Email address is on the suppression list", None
        ),
        EntryResult(12, Outcome.RETRY, "TRANSIENT_FAILURE", None),
        EntryResult(13, Outcome.FAILED, "BRAND_NEW_STATUS", None),
    ]


@pytest.mark.parametrize("returned", [0, 1, 3])
def test_map_bulk_response_length_mismatch_makes_everything_unknown(returned: int) -> None:
    statuses = [("SUCCESS", f"m-{i}", None) for i in range(returned)]
    results = map_bulk_response([1, 2], statuses)
    assert [r.seq for r in results] == [1, 2]
    assert all(r.outcome is Outcome.UNKNOWN for r in results)
    assert all(r.reason == "response length mismatch" for r in results)
    assert all(r.message_id is None for r in results)


def test_map_bulk_response_empty() -> None:
    assert map_bulk_response([], []) == []


def test_outcome_values_are_plain_strings() -> None:
    # stored as-is in status/reason columns and log fields
    assert str(Outcome.PAUSE_CAMPAIGN) == "pause_campaign"
    assert f"{Outcome.SENT}" == "sent"
    assert Outcome("unknown") is Outcome.UNKNOWN
