"""Field domains a consumed record must satisfy before its effect reaches PostgreSQL (pure).

An Avro contract says `string` or `long`; our tables and Python's datetime are narrower: a
`uuid` column, a btree key of at most ~2,700 bytes, `text` that cannot hold NUL, a timestamp
that must be a date. A record that decodes but breaks one of these is poison: it goes to the
dead-letter topic with a reason, never into a statement that fails on it (a failing statement
is taken for "database unavailable" and retried forever, a stuck partition) and never into a
conversion that raises in the agent (a crash loop at the same offset).

Each check returns None when the value is in its domain, else a short text for the dead
letter's detail.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

# Epoch milliseconds before 2000-01-01 are a unit error (seconds sent as milliseconds) or an
# unset 0, never a real event of this system.
MIN_EPOCH_MS = 946_684_800_000
# Python's datetime ends at 9999-12-31; milliseconds sent as microseconds land beyond it.
MAX_EPOCH_MS = 253_402_300_799_999
# How far ahead of our clock an event's own time may be: clock skew, not a unit error.
MAX_CLOCK_SKEW_MS = 86_400_000
# A btree entry holds at most ~2,700 bytes; 512 characters of UTF-8 stay below it.
MAX_KEY_CHARS = 512
# Free text kept in a row (names, items, diagnostics): far above any real value, far below
# what would bloat a row or a log line.
MAX_TEXT_CHARS = 65_536
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def uuid_problem(value: Any) -> str | None:
    """A text UUID (the form every event id column stores)."""
    if not isinstance(value, str):
        return f"not a string: {type(value).__name__}"
    if len(value) > 64:
        return "not a UUID (too long)"
    if _CANONICAL_UUID.fullmatch(value):
        return None  # the form our producers write, checked without building a UUID
    try:
        uuid.UUID(value)
    except ValueError:
        return f"not a UUID: {value[:40]!r}"
    return None


def epoch_ms_problem(
    value: Any, *, now_ms: int, max_ahead_ms: int = MAX_CLOCK_SKEW_MS
) -> str | None:
    """Epoch milliseconds of a real instant: after 2000, at most `max_ahead_ms` after now."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"not an integer: {type(value).__name__}"
    if value < MIN_EPOCH_MS:
        return f"{value} ms is before 2000-01-01 (seconds sent as milliseconds?)"
    if value > min(MAX_EPOCH_MS, now_ms + max_ahead_ms):
        return f"{value} ms is too far in the future (microseconds sent as milliseconds?)"
    return None


def storable_ms_problem(value: Any) -> str | None:
    """Epoch milliseconds a timestamp column and datetime can hold (1970 to 9999): for times
    that are information, not decisions (an SES event's own time)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"not an integer: {type(value).__name__}"
    if not 0 <= value <= MAX_EPOCH_MS:
        return f"{value} ms is outside 1970..9999 (microseconds sent as milliseconds?)"
    return None


def key_problem(value: Any, max_chars: int = MAX_KEY_CHARS) -> str | None:
    """Text used as a key (a UNIQUE column, an index): present and short enough."""
    if not isinstance(value, str) or not value:
        return "empty"
    if len(value) > max_chars:
        return f"{len(value)} characters, at most {max_chars}"
    return None


def text_problem(record: Any, max_chars: int = MAX_TEXT_CHARS, path: str = "") -> str | None:
    """Any string anywhere in `record` (maps, arrays) that PostgreSQL cannot store (NUL) or
    that is longer than `max_chars`; names the field."""
    if isinstance(record, str):
        if "\x00" in record:
            return f"{path or 'value'}: contains NUL"
        if len(record) > max_chars:
            return f"{path or 'value'}: {len(record)} characters, at most {max_chars}"
        return None
    if isinstance(record, Mapping):
        for key, value in record.items():
            # The usual field, inline: a short key and a scalar (no path built, no recursion).
            if type(key) is str and "\x00" not in key and len(key) <= max_chars:
                kind = type(value)
                if kind is str:
                    if "\x00" not in value and len(value) <= max_chars:
                        continue
                elif value is None or kind is int or kind is float or kind is bool:
                    continue
            problem = text_problem(key, max_chars, path) or text_problem(
                value, max_chars, f"{path}.{key}" if path else str(key)
            )
            if problem is not None:
                return problem
        return None
    if isinstance(record, Sequence) and not isinstance(record, bytes | bytearray):
        for i, value in enumerate(record):
            problem = text_problem(value, max_chars, f"{path}[{i}]")
            if problem is not None:
                return problem
    return None
