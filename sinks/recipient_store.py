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

A campaign with a promo pool (migration 0021) gets one code per claimed recipient in the
claim's transaction (`bind_promo_codes`, sinks/sql/promo.sql): the code the recipient already
holds, else a free one. Recipients the pool has no code for go back to pending and the campaign
pauses, reason `promo_pool_empty`, in that same transaction: nothing is sent without a code.
Campaigns without a pool run exactly the statements they ran before.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from sinks.offsets import Fence, PartitionOffsets, PartitionSpan, StoreUnavailable
from sinks.pg_arrays import int_array, text_array
from sinks.queries import query
from sinks.recipient_partitions import DIRECT_TRIGGER, partition_name, partition_of

__all__ = ["PROMO_POOL_EMPTY", "PartitionSpan", "RecipientStore", "StoreUnavailable"]

PROMO_POOL_EMPTY = "promo_pool_empty"  # the pause reason when a claim finds no free code
SLOTS = 2**31 - 1  # promo_codes.slot is uniform in [0, SLOTS] (migration 0021)


@dataclass(frozen=True)
class ClaimedRecipient:
    campaign_id: int
    seq: int
    user_id: int
    email: str
    first_name: str | None
    attempt: int = 0  # the claim's `attempts`: its token in enter_call and record_results
    promo_code: str | None = None  # bound in the claim's transaction (campaigns with a pool)
    variant: str | None = None  # an A/B test's variant: its template (LiveCampaign.template_for)
    send_before: datetime | None = None  # an SMS row's deadline: its local send window's end


# A recipient to claim: (Kafka offset of its doorbell, (campaign id, seq)).
OfferedKey = tuple[int, tuple[int, int]]


@dataclass(frozen=True)
class ClaimOutcome:
    claimed: list[ClaimedRecipient]
    skipped: int
    fenced: int = 0  # recipients whose doorbell is below the stored offset: claimed before
    stale: dict[int, int | None] = field(default_factory=dict)  # partition -> epoch held here
    epochs: dict[int, int] = field(default_factory=dict)  # partition -> epoch claimed under
    codeless: int = 0  # claimed, found the promo pool empty: back to pending, campaign paused


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
    ramp: list[dict[str, float]] | None = None  # a rate ramp's [{at_s, rate}] (rules/ramp.py)
    sending_elapsed_s: float = 0.0  # seconds spent sending, as of the read (the ramp's clock)
    channel: str = "email"  # "sms": template is the body, from_address the origination id
    rate_unit: str = "messages"  # what rate_limit counts; "segments" only for SMS
    sending_began_s_ago: float | None = None  # since the snapshot made its rows sendable
    push_ttl_s: int | None = None  # a push campaign's notification lifetime (None: default)
    push_collapse_key: str | None = None  # … and its collapse key

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
    release_codeless: str


def _on(name: str, table: sql.Composable) -> str:
    return sql.SQL(query(name)).format(partition=table).as_string(None)


# For a campaign without a partition of its own with the trigger.
_RECORD_VIA_PARENT = _on("record_results", sql.SQL("campaign_recipients"))
_ENTER_VIA_PARENT = _on("enter_call", sql.SQL("campaign_recipients"))
_CODELESS_VIA_PARENT = _on("release_codeless", sql.SQL("campaign_recipients"))


class CampaignNotSending(Exception):
    """The campaign was paused, cancelled or ended before a call entered: nothing is sent."""


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
        # Per started campaign: whether it has a promo pool (never changes once started).
        self._pools: dict[int, bool] = {}

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
                release_codeless=_on("release_codeless", table),
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
            pooled = {cid for cid in seqs_by_campaign if await self._has_pool(conn, cid)}
            codes: dict[tuple[int, int], str] | None = None
            codeless: dict[int, int] = {}
            if pooled:
                codes, codeless = await self._bind_codes(conn, pooled, rows)
            claimed: list[ClaimedRecipient] = []
            skipped = 0
            for cid, seq, user_id, email, first_name, status, attempt, variant, before in rows:
                if status == "sending":
                    if codes is None:
                        code = None
                    elif (code := codes.get((cid, seq))) is None and cid in codeless:
                        continue  # released: the pool had no code for it
                    claimed.append(
                        ClaimedRecipient(
                            cid, seq, user_id, email, first_name, attempt, code, variant, before
                        )
                    )
                elif status == "skipped":
                    skipped += 1
                # 'pending': a paused campaign's row, flagged for requeue on resume
            return ClaimOutcome(
                claimed,
                skipped,
                fenced,
                dict(fence.stale),
                dict(fence.epochs),
                sum(codeless.values()),
            )

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

    async def _has_pool(self, conn: psycopg.AsyncConnection[Any], cid: int) -> bool:
        if cid in self._pools:
            return self._pools[cid]
        cur = await conn.execute(query("promo_campaign"), {"campaign_id": cid})
        row = await cur.fetchone()
        has_pool = bool(row is not None and row[0])
        if row is not None and row[1] != "draft":
            self._pools[cid] = has_pool
        return has_pool

    async def _bind_codes(
        self,
        conn: psycopg.AsyncConnection[Any],
        pooled: set[int],
        rows: Sequence[tuple[Any, ...]],
    ) -> tuple[dict[tuple[int, int], str], dict[int, int]]:
        """Bind a promo code to each row just claimed ('sending') of the `pooled` campaigns;
        release the rows the pool had none for and pause their campaign. Returns the codes
        by (campaign, seq) and, per campaign, how many rows were released."""
        sending: dict[int, list[int]] = {}
        for row in rows:
            if row[5] == "sending" and row[0] in pooled:
                sending.setdefault(int(row[0]), []).append(int(row[1]))
        codes: dict[tuple[int, int], str] = {}
        codeless: dict[int, int] = {}
        for cid in sorted(sending):
            seqs = sending[cid]
            cur = await conn.execute(
                query("bind_promo_codes"),
                {"campaign_id": cid, "seqs": int_array(seqs), "slot": random.randrange(SLOTS)},
            )
            for seq, code in await cur.fetchall():
                codes[(cid, int(seq))] = str(code)
            missing = [seq for seq in seqs if (cid, seq) not in codes]
            if not missing:
                continue
            own = await self._partition_sql(conn, cid)
            await conn.execute(
                _CODELESS_VIA_PARENT if own is None else own.release_codeless,
                {"campaign_id": cid, "seqs": int_array(missing)},
            )
            await conn.execute(
                query("set_campaign_status"),
                {
                    "id": cid,
                    "status": "paused",
                    "reason": PROMO_POOL_EMPTY,
                    "from_statuses": ["sending"],
                },
            )
            codeless[cid] = len(missing)
        return codes, codeless

    async def record_results(
        self, campaign_id: int, results: Sequence[RowResult], attempts: Sequence[int]
    ) -> int:
        """Record outcomes of rows claimed with `attempts` (one per result, in order). Returns
        how many rows changed: a row no longer under its claim (the lease took it) does not."""
        try:
            async with self._pool.connection() as conn:
                own = await self._partition_sql(conn, campaign_id)
                cur = await conn.execute(
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
                return cur.rowcount
        except psycopg.Error as exc:
            raise self._unavailable(exc) from exc

    async def enter_call(
        self, campaign_id: int, rows: Sequence[ClaimedRecipient]
    ) -> tuple[set[int], int]:
        """Mark `rows` as in a call right before its request. Returns the seqs that entered
        and how many were skipped (opted out or suppressed since the claim); the others are
        no longer this claim's (their lease expired) and must not be sent. Raises
        CampaignNotSending, and changes nothing, once the campaign has left 'sending'."""
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
                    if seq is None:
                        raise CampaignNotSending(f"campaign {campaign_id} is {status}")
                    if status == "sending":
                        entered.add(int(seq))
                    else:
                        skipped += 1
                return entered, skipped
        except psycopg.Error as exc:
            raise self._unavailable(exc) from exc

    async def leave_call(self, campaign_id: int, rows: Sequence[ClaimedRecipient]) -> int:
        """Take `rows` out of their call: SES accepted none of them (throttled, transient) and
        they wait in the lane for their retry. Returns how many left a call."""
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    query("leave_call"),
                    {
                        "campaign_id": campaign_id,
                        "seqs": int_array(r.seq for r in rows),
                        "attempts": int_array(r.attempt for r in rows),
                    },
                )
                return cur.rowcount
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

    async def feedback_lag(self, fresh_s: float) -> float | None:
        """Seconds the feedback agent's oldest unapplied event has waited, from its reports
        younger than `fresh_s`; 0 when none is behind, None when none reports."""
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(query("feedback_lag"), {"fresh_s": fresh_s})
                row = await cur.fetchone()
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc
        return None if row is None or row[0] is None else float(row[0])

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
