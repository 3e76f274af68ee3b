"""The SMS channel's pure parts: numbers, segments, outcomes, the stand-in's limits."""

from __future__ import annotations

import pytest

from infra.ses_standin.faults import FaultConfig
from infra.ses_standin.sms import SmsAccount, SmsError
from streams.rules.phones import normalise_phone, phone_problem
from streams.rules.sms_outcomes import TextOutcome, classify_text_error
from streams.rules.sms_text import count_segments, render_body


@pytest.mark.parametrize(
    ("raw", "number", "problem"),
    [
        ("+84 912 345 678", "+84912345678", None),
        ("+1 (206) 555-0100", "+12065550100", None),
        ("0084912345678", "+84912345678", None),
        ("+84.912.345.678", "+84912345678", None),
        ("", "", "empty"),
        ("0912345678", "0912345678", "no_country_code"),
        ("+0912345678", "+0912345678", "not_e164"),
        ("+1234567", "+1234567", "not_e164"),  # 7 digits: too short
        ("+12345678", "+12345678", None),
        ("+123456789012345", "+123456789012345", None),  # 15 digits: the most E.164 allows
        ("+1234567890123456", "+1234567890123456", "not_e164"),
        ("+84\t912345678", "+84\t912345678", "not_e164"),
        ("+８４912345678", "+８４912345678", "not_e164"),  # non-ASCII digits
    ],
)
def test_phone_normal_form_and_check(raw: str, number: str, problem: str | None) -> None:
    assert normalise_phone(raw) == number
    assert phone_problem(number) == problem


@pytest.mark.parametrize(
    ("body", "encoding", "count"),
    [
        ("", "GSM-7", 0),
        ("a" * 160, "GSM-7", 1),
        ("a" * 161, "GSM-7", 2),
        ("a" * 306, "GSM-7", 2),  # 2 x 153
        ("a" * 307, "GSM-7", 3),
        ("€" * 80, "GSM-7", 1),  # 160 septets: each extension character takes two
        ("€" * 81, "GSM-7", 2),
        ("ạ" * 70, "UCS-2", 1),
        ("ạ" * 71, "UCS-2", 2),
        ("ạ" * 134, "UCS-2", 2),  # 2 x 67
        ("ạ" * 135, "UCS-2", 3),
        ("a" * 159 + "😀", "UCS-2", 3),  # one emoji makes it all UCS-2; it takes two units
    ],
)
def test_segments(body: str, encoding: str, count: int) -> None:
    seg = count_segments(body)
    assert (seg.encoding, seg.count) == (encoding, count)


def test_gsm_split_never_cuts_an_escape_pair() -> None:
    # 152 plain septets then an extension pair: 154 > 153, so the pair starts segment two,
    # and 306 septets need three segments where 2 x 153 would hold them.
    assert count_segments("a" * 152 + "€" + "a" * 151).count == 2
    assert count_segments("a" * 152 + "€" + "a" * 152).count == 3


def test_render_body() -> None:
    assert render_body("Hi {{first_name}}, {{ promo_code }}{{nope}}!", {"first_name": "An"}) == (
        "Hi An, !"
    )


@pytest.mark.parametrize(
    ("code", "status", "reason", "timed_out", "outcome"),
    [
        (None, None, None, True, TextOutcome.UNKNOWN),  # the request may have been sent
        ("ReadTimeout", None, None, True, TextOutcome.UNKNOWN),
        ("ConnectError", None, None, False, TextOutcome.RETRY),
        ("ThrottlingException", 400, None, False, TextOutcome.RETRY),
        ("InternalServerException", 500, None, False, TextOutcome.UNKNOWN),
        ("ServiceQuotaExceededException", 402, "MONTHLY_SPEND_LIMIT_REACHED_FOR_TEXT", False,
         TextOutcome.PAUSE_CAMPAIGN),
        ("AccessDeniedException", 403, "ACCOUNT_DISABLED", False, TextOutcome.PAUSE_CAMPAIGN),
        ("ResourceNotFoundException", 404, None, False, TextOutcome.PAUSE_CAMPAIGN),
        ("ConflictException", 400, "DESTINATION_PHONE_NUMBER_OPTED_OUT", False,
         TextOutcome.SKIPPED),
        ("ConflictException", 400, "MESSAGE_TYPE_MISMATCH", False, TextOutcome.FAILED),
        ("ValidationException", 400, "INVALID_PARAMETER", False, TextOutcome.FAILED),
    ],
)  # fmt: skip
def test_text_outcomes(
    code: str | None, status: int | None, reason: str | None, timed_out: bool, outcome: str
) -> None:
    verdict = classify_text_error(code, status, reason, timed_out=timed_out)
    assert verdict.outcome is outcome
    assert verdict.throttled == (code == "ThrottlingException")


def _account(**faults: float) -> SmsAccount:
    config = FaultConfig().updated(faults)
    return SmsAccount(lambda: config, lambda p: False)


def _send(account: SmsAccount, n: int, now: float, origin: str = "+12065550100") -> str:
    body = {
        "DestinationPhoneNumber": f"+8491234{n:04d}",
        "OriginationIdentity": origin,
        "MessageBody": "hi",
        "Context": {"campaign": "1"},
    }
    return account.send_text(body, now)


def test_standin_mps_is_per_origination_identity_and_refills() -> None:
    account = _account(sms_mps=3)
    for n in range(3):
        _send(account, n, 100.0)
    with pytest.raises(SmsError) as exc:
        _send(account, 3, 100.2)
    assert exc.value.code == "ThrottlingException"
    _send(account, 4, 100.2, origin="+12065550199")  # its own bucket
    _send(account, 5, 100.6)  # a third of a second refills one message
    assert account.stats("1")["accepted"] == 5
    assert account.stats("1")["max_1s_window"] == 5


def test_standin_spend_limit_refuses_beyond_it() -> None:
    account = _account(sms_monthly_spend_usd=0.012)  # two segments' worth
    _send(account, 0, 1.0)
    _send(account, 1, 1.0)
    with pytest.raises(SmsError) as exc:
        _send(account, 2, 1.0)
    assert (exc.value.code, exc.value.reason) == (
        "ServiceQuotaExceededException",
        "MONTHLY_SPEND_LIMIT_REACHED_FOR_TEXT",
    )
