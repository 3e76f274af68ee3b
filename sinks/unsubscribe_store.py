"""The one-click unsubscribe's view of PostgreSQL: one named statement, errors translated."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg_pool import AsyncConnectionPool

from sinks.queries import query
from sinks.recipient_store import StoreUnavailable


@dataclass(frozen=True)
class UnsubscribeResult:
    changed: bool  # False: already opted out (or no such user) — nothing to do, still a success
    event_id: str | None  # the Unsubscribed event waiting in feedback_outbox


class UnsubscribeStore:
    def __init__(self, pool: AsyncConnectionPool, *, topic: str) -> None:
        self._pool = pool
        self.topic = topic

    async def unsubscribe(
        self, user_id: int, campaign_id: int | None, key_id: str
    ) -> UnsubscribeResult:
        """Opt the user out of marketing now (and queue the event) in one statement."""
        params = {
            "user_id": user_id,
            "campaign_id": campaign_id,
            "key_id": key_id,
            "topic": self.topic,
        }
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(query("unsubscribe_user"), params)
                row = await cur.fetchone()
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc
        assert row is not None
        changed, event_id = int(row[0]), row[1]
        return UnsubscribeResult(changed > 0, str(event_id) if event_id else None)
