"""PushStore: the push channel's view of PostgreSQL, one method per named statement
(sinks/sql/push.sql). psycopg errors become `StoreUnavailable` here, as in RecipientStore."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg_pool import AsyncConnectionPool

from sinks.offsets import StoreUnavailable
from sinks.queries import query


@dataclass(frozen=True, slots=True)
class DeviceEndpoint:
    id: int
    user_id: int
    platform: str  # FCM | APNS
    endpoint_arn: str
    enabled: bool
    disabled_reason: str | None
    push_opt_out: bool  # the user's, as of the read (False for a user that is gone)


class PushStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    async def endpoints(self, ids: Sequence[int]) -> dict[int, DeviceEndpoint]:
        if not ids:
            return {}
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(query("push_endpoints"), {"ids": list(ids)})
                rows = await cur.fetchall()
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc
        return {
            int(r[0]): DeviceEndpoint(
                int(r[0]), int(r[1]), str(r[2]), str(r[3]), bool(r[4]), r[5], bool(r[6])
            )
            for r in rows
        }

    async def disable(self, arns: Sequence[str], reason: str) -> int:
        if not arns:
            return 0
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    query("disable_endpoints"), {"arns": list(arns), "reason": reason}
                )
                return cur.rowcount
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc


def register_device(
    conn: psycopg.Connection, user_id: int, platform: str, token: str, endpoint_arn: str
) -> int:
    """Record a device's endpoint (sinks.push.PushSender.create_endpoint made it); its id."""
    row = conn.execute(
        query("register_device"),
        {"user_id": user_id, "platform": platform, "token": token, "endpoint_arn": endpoint_arn},
    ).fetchone()
    assert row is not None
    return int(row[0])
