"""Email address hygiene: one normal form, a pragmatic validity check, simulator detection.

Why normalise: the suppression table is keyed by address, and the same mailbox reaches us
spelled differently (the user table, SES bounce/complaint events, one-click unsubscribes). If
`Jane@Example.com` complained and we look up `jane@example.com`, we must find her.

Why validate ourselves: the sender turns off botocore's parameter validation for CPU (design
§5), and one bad address can make SES refuse a whole 50-entry call. Rejecting it before the call
costs one row, skipped with a short reason, instead of a batch.

`is_valid_email` is the one validity check: the sender applies it to every row before a call,
and the snapshot reads users.email_ok, a generated column whose SQL says the same thing
(migration 0015; tests/integration/test_address_hygiene.py compares the two). Change both
together.

The check is deliberately narrower than RFC 5321/5322: it accepts what real marketing recipients
use (dot-atom local parts, ASCII hostnames with a real TLD, IDNs already in punycode) and refuses
quoted local parts, comments, IP literals, dotless domains and non-ASCII (SES does not support
SMTPUTF8). A false "invalid" costs one recipient; a false "valid" can cost a batch.
"""

from __future__ import annotations

import re
import string

SIMULATOR_DOMAIN = "simulator.amazonses.com"

MAX_ADDRESS_LENGTH = 254  # RFC 5321 path limit (256) minus the angle brackets
MAX_LOCAL_LENGTH = 64
MAX_LABEL_LENGTH = 63

# RFC 5322 atext: what a dot-atom local part may contain besides the dots between atoms.
_ATEXT = frozenset(string.ascii_letters + string.digits + "!#$%&'*+-/=?^_`{|}~")
_LABEL_CHARS = frozenset(string.ascii_letters + string.digits + "-")

# The common case in one C-level match: a dot-atom local part, hostname labels, an alphabetic
# or punycode TLD. It accepts only what the checks below accept (a test holds the two to it), so
# a row it does not match goes through them for its reason; the sender checks every row.
_ATOM = r"[A-Za-z0-9!#$%&'*+\-/=?^_`{|}~]+"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_TLD = r"(?:[A-Za-z]{2,63}|[Xx][Nn]--[A-Za-z0-9-]{0,58}[A-Za-z0-9])"
_PLAIN = re.compile(rf"{_ATOM}(?:\.{_ATOM})*@(?:{_LABEL}\.)+{_TLD}")


def normalise_email(addr: str) -> str:
    """The canonical form used for suppression keys and dedupe: stripped and lowercased.

    The domain is case-insensitive by definition. The local part is case-sensitive in theory
    (RFC 5321 §2.4), but no mainstream mailbox provider treats it so, and suppression must match
    whatever case a bounce, complaint or unsubscribe comes back in: wrongly suppressing
    `John@x` because `john@x` complained is cheap, mailing a complainer again is not. Dots and
    `+tags` are kept: removing them is provider-specific and would merge distinct mailboxes.
    """
    return addr.strip().lower()


def _local_problem(local: str) -> str | None:
    if not local:
        return "empty_local"
    if len(local) > MAX_LOCAL_LENGTH:
        return "local_too_long"
    if local.startswith(".") or local.endswith(".") or ".." in local:
        return "bad_local"
    if any(ch != "." and ch not in _ATEXT for ch in local):
        return "bad_local"  # quotes, commas, brackets, backslashes: legal only when quoted
    return None


def _label_ok(label: str) -> bool:
    return (
        0 < len(label) <= MAX_LABEL_LENGTH
        and all(ch in _LABEL_CHARS for ch in label)
        and not label.startswith("-")
        and not label.endswith("-")
    )


def _domain_ok(domain: str) -> bool:
    labels = domain.split(".")
    if len(labels) < 2 or not all(_label_ok(label) for label in labels):
        return False  # also refuses "localhost", "[10.0.0.1]" and a trailing dot
    tld = labels[-1].lower()
    # A real TLD is alphabetic (or an IDN in punycode); this also refuses "1.2.3.4".
    return len(tld) >= 2 and (tld.isalpha() or tld.startswith("xn--"))


def is_valid_email(addr: str) -> str | None:
    """None when `addr` is sendable as it stands, else a short reason for the failed row.

    Reasons: `empty`, `whitespace`, `control_char`, `non_ascii`, `too_long`, `no_at`,
    `multiple_at`, `empty_local`, `local_too_long`, `bad_local`, `bad_domain`.

    The address is checked exactly as given, so pass it through `normalise_email` first if
    surrounding spaces should be forgiven.
    """
    if (
        len(addr) <= MAX_ADDRESS_LENGTH
        and _PLAIN.fullmatch(addr) is not None
        and addr.index("@") <= MAX_LOCAL_LENGTH
    ):
        return None
    return _problem(addr)


def _problem(addr: str) -> str | None:
    if not addr:
        return "empty"
    if any(ch.isspace() for ch in addr):
        return "whitespace"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in addr):
        return "control_char"
    if not addr.isascii():
        return "non_ascii"
    if len(addr) > MAX_ADDRESS_LENGTH:
        return "too_long"
    if "@" not in addr:
        return "no_at"
    local, _, domain = addr.rpartition("@")
    if "@" in local:
        return "multiple_at"
    problem = _local_problem(local)
    if problem is not None:
        return problem
    if not _domain_ok(domain):
        return "bad_domain"
    return None


def is_simulator_address(addr: str) -> bool:
    """True for SES mailbox-simulator addresses (`*@simulator.amazonses.com`).

    They are used in load tests and smoke tests; their bounces and complaints are simulated, so
    the feedback path must never put them in the suppression table.
    """
    _, at, domain = normalise_email(addr).rpartition("@")
    return bool(at) and domain == SIMULATOR_DOMAIN
