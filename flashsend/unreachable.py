"""One line for the most common first-run failures: a service of the stack does not answer,
or its database has not taken this version's migrations yet."""

from __future__ import annotations

import psycopg

_REFUSED = ("connection failed", "connection refused", "could not connect", "timeout expired")


def stack_hint(exc: BaseException) -> str | None:
    """`exc` as one line that says how to fix it, when it means PostgreSQL does not answer or
    the database lacks a table or column of a newer migration; None for anything else (those
    keep their own message or traceback)."""
    text = " ".join(str(exc).split())
    if isinstance(exc, psycopg.errors.UndefinedColumn | psycopg.errors.UndefinedTable):
        first = text.split(" LINE ")[0]
        return (
            f"the database is older than this flashsend ({first}): apply its migrations with "
            "`flashsend migrate` (`flashsend up` does too)"
        )
    if not isinstance(exc, psycopg.OperationalError):
        return None
    if not any(marker in text.lower() for marker in _REFUSED):
        return None
    return (
        f"PostgreSQL does not answer ({text}): start the local stack with `flashsend up`, "
        "or point FLASHSEND_PG_DSN at your server"
    )
