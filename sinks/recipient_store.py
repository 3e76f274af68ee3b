"""RecipientStore: the campaign sender's view of PostgreSQL, one method per named statement.

Claim + offset advance happen in ONE transaction (`claim_batch`): either both the claimed rows
and the new offsets are committed, or neither. psycopg errors are translated here into
`StoreUnavailable` (retry later) so stream code never sees a driver exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from sinks import offsets
from sinks.offsets import PartitionSpan, StoreUnavailable
from sinks.pg_arrays import int_array, text_array
from sinks.queries import query

__all__ = ["PartitionSpan", "RecipientStore", "StoreUnavailable"]


@dataclass(frozen=True)
class ClaimedRecipient:
    campaign_id: int
    seq: int
    user_id: int
    email: str
    first_name: str | None


@dataclass(frozen=True)
class ClaimOutcome:
    claimed: list[ClaimedRecipient]
    skipped: int
    fenced_partitions: list[int]  # partitions whose batch someone else already processed


@dataclass(frozen=True)
class RowResult:
    seq: int
    status: str  # sent | failed | pending | unknown
    reason: str | None
    message_id: str | None


@dataclass(frozen=True)
class LiveCampaign:
    id: int
    status: str
    rate_limit: float
    template: str
    from_address: str
    configuration_set: str | None
    name: str


class RecipientStore:
    def __init__(self, pool: AsyncConnectionPool, *, group_id: str, topic: str) -> None:
        self._pool = pool
        self.dsn = str(pool.conninfo)
        self.group_id = group_id
        self.topic = topic

    async def ensure_and_load_offsets(self, partitions: Sequence[int]) -> dict[int, int]:
        return await offsets.ensure_and_load(self._pool, self.group_id, self.topic, partitions)

    async def claim_batch(
        self, spans: Sequence[PartitionSpan], keys_by_partition: dict[int, list[tuple[int, int]]]
    ) -> ClaimOutcome:
        try:
            async with self._pool.connection() as conn, conn.transaction():
                advanced, fenced = await offsets.advance(conn, self.group_id, self.topic, spans)
                keys = [k for p in advanced for k in keys_by_partition.get(p, [])]
                if not keys:
                    return ClaimOutcome([], 0, fenced)
                cur = await conn.execute(
                    query("claim_batch"),
                    {
                        "campaign_ids": int_array(k[0] for k in keys),
                        "campaigns": int_array({k[0] for k in keys}),
                        "seqs": int_array(k[1] for k in keys),
                    },
                )
                claimed: list[ClaimedRecipient] = []
                skipped = 0
                for cid, seq, user_id, email, first_name, status in await cur.fetchall():
                    if status == "sending":
                        claimed.append(ClaimedRecipient(cid, seq, user_id, email, first_name))
                    elif status == "skipped":
                        skipped += 1
                    # 'pending': a paused campaign's row, flagged for requeue on resume
                return ClaimOutcome(claimed, skipped, fenced)
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc

    async def record_results(self, campaign_id: int, results: Sequence[RowResult]) -> None:
        try:
            async with self._pool.connection() as conn:
                await conn.execute(
                    query("record_results"),
                    {
                        "campaign_id": campaign_id,
                        "seqs": int_array(r.seq for r in results),
                        "statuses": text_array(r.status for r in results),
                        "reasons": text_array(r.reason for r in results),
                        "message_ids": text_array(r.message_id for r in results),
                    },
                )
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc

    async def live_campaigns(self) -> list[LiveCampaign]:
        try:
            async with self._pool.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(query("live_campaigns"))
                return [LiveCampaign(**row) for row in await cur.fetchall()]
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc

    async def pause_campaign(self, campaign_id: int, reason: str) -> bool:
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    query("set_campaign_status"),
                    {
                        "id": campaign_id,
                        "status": "paused",
                        "reason": reason,
                        "from_statuses": ["sending"],
                    },
                )
                return cur.rowcount > 0
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc

    async def campaign_statuses(self, ids: Sequence[int]) -> dict[int, str]:
        """Status of each campaign that exists, by id (missing ids: no such campaign)."""
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT id, status FROM campaigns WHERE id = ANY(%s)", (list(ids),)
                )
                return {int(r[0]): str(r[1]) for r in await cur.fetchall()}
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc
