"""The Postgres offset store shared by every consumer (campaign sender, mail service,
feedback): offsets are stored with the effects, in the same transaction (design §4)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from flashsend.errors import FlashsendError
from sinks.queries import query


class StoreUnavailable(FlashsendError):
    """PostgreSQL could not be reached or the transaction failed; retry with backoff."""


@dataclass(frozen=True)
class PartitionSpan:
    partition: int
    first_offset: int
    last_offset: int


async def ensure_and_load(
    pool: AsyncConnectionPool, group_id: str, topic: str, partitions: Sequence[int]
) -> dict[int, int]:
    """On assignment: make sure every partition has a row (so the fence always has something
    to lock) and return the stored next offsets."""
    params = {"group_id": group_id, "topic": topic, "partitions": list(partitions)}
    try:
        async with pool.connection() as conn:
            await conn.execute(query("ensure_offsets"), params)
            cur = await conn.execute(query("load_offsets"), params)
            return {int(p): int(o) for p, o in await cur.fetchall()}
    except psycopg.Error as exc:
        raise StoreUnavailable(str(exc)) from exc


async def advance(
    conn: psycopg.AsyncConnection[Any], group_id: str, topic: str, spans: Sequence[PartitionSpan]
) -> tuple[set[int], list[int]]:
    """Advance the fenced offsets inside the caller's transaction. Returns the partitions that
    advanced (apply their effects) and the fenced ones (already processed elsewhere)."""
    cur = await conn.execute(
        query("advance_offsets"),
        {
            "group_id": group_id,
            "topic": topic,
            "partitions": [s.partition for s in spans],
            "first_offsets": [s.first_offset for s in spans],
            "last_offsets": [s.last_offset for s in spans],
        },
    )
    advanced = {int(r[0]) for r in await cur.fetchall()}
    return advanced, [s.partition for s in spans if s.partition not in advanced]
