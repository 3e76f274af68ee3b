"""One line for the most common first-run failure: a service of the stack does not answer."""

from __future__ import annotations

import psycopg

_REFUSED = ("connection failed", "connection refused", "could not connect", "timeout expired")


def stack_hint(exc: BaseException) -> str | None:
    """`exc` as one line that says how to fix it, when it means PostgreSQL does not answer;
    None for anything else (those keep their own message or traceback)."""
    if not isinstance(exc, psycopg.OperationalError):
        return None
    text = " ".join(str(exc).split())
    if not any(marker in text.lower() for marker in _REFUSED):
        return None
    return (
        f"PostgreSQL does not answer ({text}): start the local stack with `flashsend up`, "
        "or point FLASHSEND_PG_DSN at your server"
    )
