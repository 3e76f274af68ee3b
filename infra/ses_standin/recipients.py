"""Email addresses and message destinations (pure).

SES counts, throttles and bills per recipient, so a message's recipients are kept both as
given (display names included, as events later echo them) and as normalized keys (bare
address, lower-cased) for statistics and duplicate detection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from email.message import Message
from email.utils import getaddresses, parseaddr
from typing import Any

from infra.ses_standin.errors import BadRequest

MAX_RECIPIENTS_PER_MESSAGE = 50

# What SES accepts as a destination of a bulk call (it does not support SMTPUTF8): an ASCII
# dot-atom local part of 1..64 characters (no quoted strings, comments, control characters,
# spaces, or leading, trailing or consecutive dots), then a domain of 1..255 characters made of
# two or more LDH labels of 1..63 characters whose last label has a letter (no IP literal such
# as `[10.0.0.1]` or `10.0.0.1`, no dotless or trailing-dot domain). A violation is a 400
# BadRequestException for the whole call, naming the address.
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_ADDRESS_RE = re.compile(
    rf"(?=[^@]{{1,64}}@){_ATOM}(?:\.{_ATOM})*"
    rf"@(?=[^@]{{1,255}}\Z)(?:{_LABEL}\.)+(?=[A-Za-z0-9-]*[A-Za-z])[A-Za-z0-9][A-Za-z0-9-]{{0,61}}"
    r"[A-Za-z0-9]\Z"
)


@dataclass(frozen=True, slots=True)
class Recipients:
    """A message's destination: addresses as given, plus normalized keys for indexing."""

    to: tuple[str, ...]
    cc: tuple[str, ...]
    bcc: tuple[str, ...]
    keys: tuple[str, ...]  # lower-cased bare addresses of to + cc + bcc

    @property
    def count(self) -> int:
        return len(self.keys)


def parse_address(value: Any, where: str) -> tuple[str, str]:
    """Return (address as given, lower-cased bare address); accepts `Name <addr>`."""
    if not isinstance(value, str):
        raise BadRequest(f"{where}: email address must be a string.")
    if _ADDRESS_RE.fullmatch(value) is not None:
        return value, value.lower()
    bare = parseaddr(value)[1] if "<" in value else ""
    if not bare or _ADDRESS_RE.fullmatch(bare) is None:
        raise BadRequest(f"Illegal address: {value!r} in {where}.")
    return value, bare.lower()


def parse_destination(obj: dict[str, Any], where: str) -> Recipients:
    """A `Destination` with 1..50 addresses over To, Cc and Bcc."""
    lists: list[tuple[str, ...]] = []
    keys: list[str] = []
    for field in ("ToAddresses", "CcAddresses", "BccAddresses"):
        raw = obj.get(field)
        if raw is None:
            lists.append(())
            continue
        if not isinstance(raw, list):
            raise BadRequest(f"{where}.{field} must be a list.")
        given: list[str] = []
        for item in raw:
            # A bare address (the usual case) inline; display names and errors via
            # parse_address. Same checks, one function call fewer per recipient.
            if isinstance(item, str) and _ADDRESS_RE.fullmatch(item) is not None:
                given.append(item)
                keys.append(item.lower())
                continue
            address, key = parse_address(item, where)
            given.append(address)
            keys.append(key)
        lists.append(tuple(given))
    if not keys:
        raise BadRequest(f"{where} must contain at least one recipient.")
    if len(keys) > MAX_RECIPIENTS_PER_MESSAGE:
        raise BadRequest(
            f"{where} has {len(keys)} recipients; the maximum is {MAX_RECIPIENTS_PER_MESSAGE}."
        )
    return Recipients(lists[0], lists[1], lists[2], tuple(keys))  # to, cc, bcc, keys


def parse_raw_recipients(headers: Message) -> Recipients:
    pairs: list[tuple[str, ...]] = []
    keys: list[str] = []
    for field in ("To", "Cc", "Bcc"):
        values = [str(v) for v in headers.get_all(field) or []]
        addresses = [address for _name, address in getaddresses(values) if address]
        given = []
        for address in addresses:
            parsed, key = parse_address(address, f"{field} header")
            given.append(parsed)
            keys.append(key)
        pairs.append(tuple(given))
    if not keys:
        raise BadRequest("Raw message has no recipients and no Destination was given.")
    return Recipients(to=pairs[0], cc=pairs[1], bcc=pairs[2], keys=tuple(keys))
