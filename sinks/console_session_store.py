"""The operator console's sessions (migration 0033, sinks/sql/console.sql).

The browser holds a 256-bit token; the table holds its sha256, the CSRF token of the session
and the API key it acts for. A session is usable while it is neither ended nor expired and its
key is neither revoked nor expired: one statement checks all four on every request.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from sinks.queries import query


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class ConsoleSession:
    id: int
    csrf_token: str
    expires_at: datetime
    api_key_id: int
    name: str  # the key's name: who the audit log says acted
    role: str


class ConsoleSessionStore:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def create(self, token: str, csrf_token: str, api_key_id: int, ttl_s: float) -> datetime:
        """A new session of `api_key_id` ending `ttl_s` from now; its expiry."""
        self.conn.execute(query("delete_old_console_sessions"))
        row = self.conn.execute(
            query("insert_console_session"),
            {
                "token_hash": token_hash(token),
                "csrf_token": csrf_token,
                "api_key_id": api_key_id,
                "ttl_s": ttl_s,
            },
        ).fetchone()
        assert row is not None
        expires_at: datetime = row[1]
        return expires_at

    def usable(self, token: str) -> ConsoleSession | None:
        cur = self.conn.cursor(row_factory=dict_row)
        row = cur.execute(query("console_session_by_token"), {"token_hash": token_hash(token)})
        found = row.fetchone()
        return None if found is None else ConsoleSession(**found)

    def end(self, token: str) -> bool:
        row = self.conn.execute(
            query("end_console_session"), {"token_hash": token_hash(token)}
        ).fetchone()
        return row is not None
