"""API keys, named audiences and Idempotency-Key answers (migration 0030,
sinks/sql/api.sql). Creating or revoking a key and registering an audience write their audit
row in the same transaction."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from flashsend.errors import Conflict, NotFound, UsageError
from sinks.audit_store import Actor, record
from sinks.queries import query


@dataclass(frozen=True)
class StoredKey:
    id: int
    name: str
    key_hash: bytes
    role: str
    usable: bool  # neither revoked nor expired


@dataclass(frozen=True)
class Claimed:
    """What a request with an Idempotency-Key finds: it owns the key (`owner`), or the first
    request's hash and answer (status None: still running)."""

    owner: bool
    request_hash: bytes | None = None
    status: int | None = None
    body: Any = None


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}


def check_audience(conn: psycopg.Connection[Any], condition: str) -> None:
    """An audience must be one SQL condition over users u: planned (never run) in a
    read-only transaction, as a prepared statement (one statement only)."""
    if ";" in condition or not condition.strip():
        raise UsageError("audience condition: one SQL condition over users u, no ';'")
    try:
        with conn.transaction():
            conn.execute("SET TRANSACTION READ ONLY")
            statement = sql.SQL("EXPLAIN SELECT 1 FROM users u WHERE {}").format(
                sql.SQL(condition)  # an admin-given condition, by design
            )
            conn.execute(statement, prepare=True)
    except psycopg.Error as exc:
        raise UsageError(f"audience condition: {str(exc).strip().splitlines()[0]}") from None


class ApiKeyStore:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def create(
        self,
        *,
        name: str,
        prefix: str,
        key_hash: bytes,
        role: str,
        expires_at: datetime | None,
        actor: Actor,
    ) -> int:
        try:
            with self.conn.transaction():
                row = self.conn.execute(
                    query("insert_api_key"),
                    {
                        "name": name,
                        "prefix": prefix,
                        "key_hash": key_hash,
                        "role": role,
                        "created_by": actor.who,
                        "expires_at": expires_at,
                    },
                ).fetchone()
                assert row is not None
                record(
                    self.conn,
                    actor,
                    "api-key create",
                    None,
                    None,
                    role,
                    {"name": name, "prefix": prefix, "expires_at": expires_at},
                )
        except psycopg.errors.UniqueViolation:
            raise Conflict(f"an API key named {name!r} exists already") from None
        except psycopg.errors.CheckViolation:
            raise Conflict(f"key name {name!r}: use 1-64 of A-Z a-z 0-9 _ . -") from None
        return int(row[0])

    def by_prefix(self, prefix: str) -> StoredKey | None:
        row = self.conn.execute(query("api_key_by_prefix"), {"prefix": prefix}).fetchone()
        if row is None:
            return None
        key_id, name, digest, role, _expires, revoked, expired = row
        return StoredKey(
            int(key_id), str(name), bytes(digest), str(role), revoked is None and not expired
        )

    def usable(self, key_id: int) -> bool:
        row = self.conn.execute(query("api_key_usable"), {"id": key_id}).fetchone()
        return bool(row and row[0])

    def keys(self) -> list[dict[str, Any]]:
        cur = self.conn.cursor(row_factory=dict_row)
        return [_plain(r) for r in cur.execute(query("list_api_keys")).fetchall()]

    def revoke(self, who: str, actor: Actor) -> dict[str, Any]:
        with self.conn.transaction():
            row = self.conn.execute(query("revoke_api_key"), {"who": who}).fetchone()
            if row is None:
                raise NotFound(f"no usable API key named or prefixed {who!r}")
            record(
                self.conn,
                actor,
                "api-key revoke",
                None,
                None,
                "revoked",
                {"name": row[1], "prefix": row[2]},
            )
        return {"id": int(row[0]), "name": str(row[1]), "prefix": str(row[2])}

    # Named audiences.
    def add_audience(self, name: str, condition: str, actor: Actor) -> None:
        check_audience(self.conn, condition)
        try:
            with self.conn.transaction():
                self.conn.execute(
                    query("insert_audience"),
                    {"name": name, "condition": condition, "by": actor.who},
                )
                record(
                    self.conn,
                    actor,
                    "audience add",
                    None,
                    None,
                    None,
                    {"name": name},  # its SQL stays with the audience (admin only)
                )
        except psycopg.errors.UniqueViolation:
            raise Conflict(f"an audience named {name!r} exists already") from None
        except psycopg.errors.CheckViolation:
            raise Conflict(f"audience name {name!r}: use 1-64 of A-Z a-z 0-9 _ . -") from None

    def audience(self, name: str) -> str | None:
        row = self.conn.execute(query("audience_by_name"), {"name": name}).fetchone()
        return None if row is None else str(row[1])

    def audiences(self) -> list[dict[str, Any]]:
        cur = self.conn.cursor(row_factory=dict_row)
        return [_plain(r) for r in cur.execute(query("list_audiences")).fetchall()]

    # Idempotency-Key answers.
    def claim(self, key_id: int, key: str, request_hash: bytes) -> Claimed:
        params = {"api_key_id": key_id, "key": key, "request_hash": request_hash}
        if self.conn.execute(query("claim_idempotency_key"), params).fetchone() is not None:
            return Claimed(owner=True)
        row = self.conn.execute(query("claimed_idempotency_key"), params).fetchone()
        if row is None:  # given back meanwhile (the first request failed): claim again
            return self.claim(key_id, key, request_hash)
        return Claimed(False, bytes(row[0]), row[1], row[2])

    def take_over(self, key_id: int, key: str, request_hash: bytes, stale_s: float) -> bool:
        params = {
            "api_key_id": key_id,
            "key": key,
            "request_hash": request_hash,
            "stale_s": stale_s,
        }
        return self.conn.execute(query("take_over_idempotency_key"), params).fetchone() is not None

    def answer(self, key_id: int, key: str, status: int, body: Any) -> None:
        self.conn.execute(
            query("answer_idempotency_key"),
            {"api_key_id": key_id, "key": key, "status": status, "body": json.dumps(body)},
        )

    def give_back(self, key_id: int, key: str) -> None:
        self.conn.execute(query("drop_idempotency_key"), {"api_key_id": key_id, "key": key})
