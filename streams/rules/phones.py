"""Phone numbers for the SMS channel: one normal form (E.164) and one validity check (pure).

Why normalise: the opt-out list and the suppression table are keyed by number, and the same
phone reaches us spelled differently (`+1 (206) 555-0100` in the user table, `+12065550100`
in the provider's opt-out list). A STOP from one spelling must suppress every other.

Why validate ourselves: a number the provider cannot parse costs a whole API call and comes
back as a ValidationException; refusing it before the call costs one row, skipped with the
reason `invalid_phone`.

The snapshot's SQL (sinks/sql/recipients.sql, snapshot_sms_recipients) applies the same two
steps; tests/integration/test_sms_channel.py compares them. Change both together.
"""

from __future__ import annotations

import re

# E.164: a plus, a country code not starting with 0, at most 15 digits in all. Eight at
# least: shorter strings are short codes or typos, never a mobile subscriber.
_E164 = re.compile(r"\+[1-9][0-9]{7,14}")
# Separators people type inside a number; anything else (letters, tabs) stays and fails.
_SEPARATORS = re.compile(r"[ ().-]")

INVALID_PHONE = "invalid_phone"


def normalise_phone(raw: str) -> str:
    """Separators removed, an international `00` prefix written as `+`."""
    number = _SEPARATORS.sub("", raw)
    if number.startswith("00"):
        number = "+" + number[2:]
    return number


def phone_problem(number: str) -> str | None:
    """Why `number` (already normalised) is not an E.164 number, or None when it is."""
    if not number:
        return "empty"
    if not number.startswith("+"):
        return "no_country_code"
    if _E164.fullmatch(number) is None:
        return "not_e164"
    return None
