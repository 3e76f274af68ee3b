"""RecipientStore: the campaign sender's view of PostgreSQL, one method per named statement.

Claim + offset advance happen in ONE transaction (`claim_batch`, through
`sinks.offsets.PartitionOffsets.transaction`): either both the claimed rows and the new offsets
are committed, or neither. Only the recipients of records at or above the stored offset of a
partition this worker owns (its epoch) are claimed. psycopg errors are translated here into
`StoreUnavailable` (retry later) so stream code never sees a driver exception.

The claim and the results name the campaign's own partition when it has one with the counter
trigger (`own_partition`, migration 0013): PostgreSQL then reuses one generic plan instead of
planning every execution on the parent. Other campaigns (legacy partition, retired, an older
database) go through the parent with the same checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from sinks.offsets import Fence, PartitionOffsets, PartitionSpan, StoreUnavailable
from sinks.pg_arrays import int_array, text_array
from sinks.queries import query
from sinks.recipient_partitions import DIRECT_TRIGGER, partition_name, partition_of

__all__ = ["PartitionSpan", "RecipientStore", "StoreUnavailable"]


@dataclass(frozen=True)
class ClaimedRecipient:
    campaign_id: int
    seq: int
    user_id: int
    email: str
    first_name: str | None
    attempt: int = 0  # the claim's `attempts`: its token in enter_call and record_results
    variant: str | None = None  # an A/B test's variant: its template (LiveCampaign.template_for)


# A recipient to claim: (Kafka offset of its doorbell, (campaign id, seq)).
OfferedKey = tuple[int, tuple[int, int]]


@dataclass(frozen=True)
class ClaimOutcome:
    claimed: list[ClaimedRecipient]
    skipped: int
    fenced: int = 0  # recipients whose doorbell is below the stored offset: claimed before
    stale: dict[int, int | None] = field(default_factory=dict)  # partition -> epoch held here
    epochs: dict[int, int] = field(default_factory=dict)  # partition -> epoch claimed under


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
    partition_weights: list[int] | None = None  # recipients per partition at first produce
    variants: list[dict[str, Any]] | None = None  # an A/B test's [{name, template, percent}]

    def template_for(self, variant: str | None) -> str:
        """The template of a row's variant (the winner's for a released holdout row); the
        campaign's own template for a row without one."""
        if variant is not None:
            for v in self.variants or ():
                if v["name"] == variant:
                    return str(v["template"])
        return self.template


@dataclass(frozen=True)
class PartitionSql:
    """The claim and the results statements naming one campaign's partition."""

    claim: str
    record: str
    enter: str


def _on(name: str, table: sql.Composable) -> str:
    return sql.SQL(query(name)).format(partition=table).as_string(None)


# For a campaign without a partition of its own with the trigger.
_RECORD_VIA_PARENT = _on("record_results", sql.SQL("campaign_recipients"))
_ENTER_VIA_PARENT = _on("enter_call", sql.SQL("campaign_recipients"))


class RecipientStore:
    def __init__(self, pool: AsyncConnectionPool, *, group_id: str, topic: str) -> None:
        self._pool = pool
        self.dsn = str(pool.conninfo)
        self.group_id = group_id
        self.topic = topic
        self.offsets = PartitionOffsets(pool, group_id=group_id, topic=topic)
        # Per campaign: its partition's statements, or None (use the parent). A partition
        # only disappears once its campaign is settled (retire); a statement that then finds
        # no table forgets this and fails as StoreUnavailable, and the retry asks again.
        self._partitions: dict[int, PartitionSql | None] = {}

    async def _partition_sql(
        self, conn: psycopg.AsyncConnection[Any], cid: int
    ) -> PartitionSql | None:
        if cid in self._partitions:
            return self._partitions[cid]
        cur = await conn.execute(
            query("own_partition"), {"name": partition_name(cid), "trigger": DIRECT_TRIGGER}
        )
        row = await cur.fetchone()
        found = None
        if row is not None and row[0]:
            table = partition_of(cid)
            found = PartitionSql(
                claim=sql.SQL(query("claim_in_partition")).format(partition=table).as_string(conn),
                record=_on("record_results", table),
                enter=_on("enter_call", table),
            )
        self._partitions[cid] = found
        return found

    def _unavailable(self, exc: psycopg.Error) -> StoreUnavailable:
        if isinstance(exc, psycopg.errors.UndefinedTable):
            self._partitions.clear()  # a partition was retired since we looked
        return StoreUnavailable(str(exc))

    async def claim_batch(
        self, spans: Sequence[PartitionSpan], keys_by_partition: dict[int, list[OfferedKey]]
    ) -> ClaimOutcome:
        """Advance the offsets of `spans` and claim the recipients the fence keeps, in ONE
        transaction."""

        async def claim(conn: psycopg.AsyncConnection[Any], fence: Fence) -> ClaimOutcome:
            kept, fenced = fence.keep(keys_by_partition)
            seqs_by_campaign: dict[int, list[int]] = {}
            for keys in kept.values():
                for cid, seq in keys:
                    seqs_by_campaign.setdefault(cid, []).append(seq)
            rows = await self._claim(conn, seqs_by_campaign)
            claimed: list[ClaimedRecipient] = []
            skipped = 0
            for cid, seq, user_id, email, first_name, status, attempt, variant in rows:
                if status == "sending":
                    claimed.append(
                        ClaimedRecipient(cid, seq, user_id, email, first_name, attempt, variant)
                    )
                elif status == "skipped":
                    skipped += 1
                # 'pending': a paused campaign's row, flagged for requeue on resume
            return ClaimOutcome(claimed, skipped, fenced, dict(fence.stale), dict(fence.epochs))

        try:
            return await self.offsets.transaction(spans, claim)
        except StoreUnavailable as exc:
            if isinstance(exc.__cause__, psycopg.errors.UndefinedTable):
                self._partitions.clear()  # a partition was retired since we looked
            raise

    async def _claim(
        self, conn: psycopg.AsyncConnection[Any], seqs_by_campaign: dict[int, list[int]]
    ) -> list[tuple[Any, ...]]:
        """One claim statement per campaign with its own partition (in id order, so two
        claimers lock rows in the same order), one on the parent for the rest."""
        rows: list[tuple[Any, ...]] = []
        via_parent: list[tuple[int, int]] = []
        for cid in sorted(seqs_by_campaign):
            seqs = seqs_by_campaign[cid]
            own = await self._partition_sql(conn, cid)
            if own is None:
                via_parent.extend((cid, seq) for seq in seqs)
                continue
            cur = await conn.execute(own.claim, {"campaign_id": cid, "seqs": int_array(seqs)})
            rows.extend(await cur.fetchall())
        if via_parent:
            cur = await conn.execute(
                query("claim_batch"),
                {
                    "campaign_ids": int_array(k[0] for k in via_parent),
                    "campaigns": int_array({k[0] for k in via_parent}),
                    "seqs": int_array(k[1] for k in via_parent),
                },
            )
            rows.extend(await cur.fetchall())
        return rows

    async def record_results(
        self, campaign_id: int, results: Sequence[RowResult], attempts: Sequence[int]
    ) -> None:
        """Record outcomes of rows claimed with `attempts` (one per result, in order)."""
        try:
            async with self._pool.connection() as conn:
                own = await self._partition_sql(conn, campaign_id)
                await conn.execute(
                    _RECORD_VIA_PARENT if own is None else own.record,
                    {
                        "campaign_id": campaign_id,
                        "seqs": int_array(r.seq for r in results),
                        "statuses": text_array(r.status for r in results),
                        "reasons": text_array(r.reason for r in results),
                        "message_ids": text_array(r.message_id for r in results),
                        "attempts": int_array(attempts),
                    },
                )
        except psycopg.Error as exc:
            raise self._unavailable(exc) from exc

    async def enter_call(
        self, campaign_id: int, rows: Sequence[ClaimedRecipient]
    ) -> tuple[set[int], int]:
        """Mark `rows` as in a call right before its request. Returns the seqs that entered
        and how many were skipped (opted out or suppressed since the claim); the others are
        no longer this claim's (their lease expired) and must not be sent."""
        try:
            async with self._pool.connection() as conn:
                own = await self._partition_sql(conn, campaign_id)
                cur = await conn.execute(
                    _ENTER_VIA_PARENT if own is None else own.enter,
                    {
                        "campaign_id": campaign_id,
                        "seqs": int_array(r.seq for r in rows),
                        "attempts": int_array(r.attempt for r in rows),
                    },
                )
                entered: set[int] = set()
                skipped = 0
                for seq, status in await cur.fetchall():
                    if status == "sending":
                        entered.add(int(seq))
                    else:
                        skipped += 1
                return entered, skipped
        except psycopg.Error as exc:
            raise self._unavailable(exc) from exc

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
