"""The deliverability path's view of PostgreSQL: `FeedbackStore` (the feedback agent) and
`UnsubscribeStore` (the one-click unsubscribe), one method per named statement.

`apply` is ONE transaction (sinks.offsets): advance the fenced offsets of the batch, apply the
effects of the records at or above the stored offset of a partition this worker owns, of the
events never seen before (suppressions, counters: one CTE), decide on the counters just written
(pure `pause_reason`) and pause the campaigns that must stop. Either all of it commits with the
offsets or none of it, so a crash or a redelivery can neither lose a complaint nor count one
twice. psycopg errors become `StoreUnavailable` (the agent retries).

The same transaction settles the campaign rows in doubt (`unknown`, or `sending` with no
answer recorded) that the events prove sent or failed: sinks.resolution_store.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from sinks.offsets import Fence, PartitionOffsets, PartitionSpan, StoreUnavailable
from sinks.pg_arrays import nullable_float_array, nullable_int_array, text_array
from sinks.queries import query
from sinks.resolution_store import resolve_in_doubt
from streams.rules.feedback_logic import FeedbackEffect, Thresholds, Window, pause_reason

log = logging.getLogger("flashsend.feedback.store")


@dataclass(frozen=True)
class ApplyOutcome:
    fresh: int = 0  # events applied (not seen before)
    suppressed: int = 0  # addresses newly suppressed
    paused: list[tuple[int, str]] = field(default_factory=list)  # (campaign, reason)
    over_threshold: list[tuple[int, str, str]] = field(default_factory=list)  # not sending
    fenced: int = 0  # records below the stored offset: applied before
    stale: dict[int, int | None] = field(default_factory=dict)  # partition -> epoch held here
    resolved: int = 0  # campaign rows in doubt that the events settled

    def plus(self, other: ApplyOutcome) -> ApplyOutcome:
        """Two outcomes as one (a batch applied in parts)."""
        return ApplyOutcome(
            self.fresh + other.fresh,
            self.suppressed + other.suppressed,
            self.paused + other.paused,
            self.over_threshold + other.over_threshold,
            self.fenced + other.fenced,
            {**self.stale, **other.stale},
            self.resolved + other.resolved,
        )


def uuid_key(event_id: str) -> str:
    """The canonical text of a UUID (lower case, 8-4-4-4-12), the form PostgreSQL prints: two
    spellings of one event id are one event."""
    if len(event_id) == 36 and event_id == event_id.lower() and event_id[8::5][:4] == "----":
        return event_id
    return str(uuid.UUID(event_id))


class FeedbackStore:
    def __init__(
        self, pool: AsyncConnectionPool, *, group_id: str, topic: str, thresholds: Thresholds
    ) -> None:
        self._pool = pool
        self.group_id = group_id
        self.topic = topic
        self.thresholds = thresholds
        self.offsets = PartitionOffsets(pool, group_id=group_id, topic=topic)

    async def apply(
        self, spans: Sequence[PartitionSpan], effects: dict[int, list[tuple[int, FeedbackEffect]]]
    ) -> ApplyOutcome:
        """Advance the fenced offsets and apply the (offset, effect) pairs the fence keeps, in
        ONE transaction."""

        async def apply(conn: psycopg.AsyncConnection[Any], fence: Fence) -> ApplyOutcome:
            kept, fenced = fence.keep(effects)
            todo = [e for p in sorted(kept) for e in kept[p]]
            outcome = ApplyOutcome() if not todo else await self._apply_effects(conn, todo)
            resolved = await resolve_in_doubt(conn, [e.proof for e in todo if e.proof])
            return replace(outcome, fenced=fenced, stale=dict(fence.stale), resolved=len(resolved))

        return await self.offsets.transaction(spans, apply)

    async def _apply_effects(
        self, conn: psycopg.AsyncConnection[Any], effects: list[FeedbackEffect]
    ) -> ApplyOutcome:
        # One effect per event id, in id order (the statement's lock order): done here, the
        # statement sorts nothing wider than the ids it inserts.
        unique: dict[str, FeedbackEffect] = {}
        for e in effects:
            unique.setdefault(uuid_key(e.event_id), e)
        todo = [unique[k] for k in sorted(unique)]
        cur = await conn.execute(
            query("apply_feedback"),
            {  # array literals: psycopg's per-element dump cost more than the statement
                "event_ids": text_array([uuid_key(e.event_id) for e in todo]),
                "emails": text_array([e.email for e in todo]),
                "campaign_ids": nullable_int_array([e.campaign_id for e in todo]),
                "counters": text_array([e.counter for e in todo]),
                "suppress": text_array([e.suppress_reason for e in todo]),
                # the source is read for a suppression only
                "sources": text_array(
                    [e.source_event if e.suppress_reason else None for e in todo]
                ),
                "variants": text_array([e.variant for e in todo]),
                "variant_counters": text_array([e.variant_counter for e in todo]),
                "engaged": text_array([e.engaged for e in todo]),
                "engaged_seqs": nullable_int_array([e.engaged_seq for e in todo]),
                "engaged_at": nullable_float_array([e.engaged_at_s for e in todo]),
            },
        )
        row = await cur.fetchone()
        assert row is not None
        fresh, suppressed, campaigns = int(row[0]), int(row[1]), row[2]
        paused: list[tuple[int, str]] = []
        over: list[tuple[int, str, str]] = []
        for counters in campaigns:
            reason = pause_reason(Window.of(counters), self.thresholds)
            if reason is None:
                continue
            campaign_id = int(counters["campaign_id"])
            if counters["status"] != "sending":
                over.append((campaign_id, str(counters["status"]), reason))
                continue
            cur = await conn.execute(
                query("auto_pause_campaign"), {"campaign_id": campaign_id, "reason": reason}
            )
            if await cur.fetchone() is not None:
                paused.append((campaign_id, reason))
        return ApplyOutcome(fresh, suppressed, paused, over)

    async def report_progress(self, waiting: Mapping[int, float | None]) -> None:
        """The agent's lag report: per partition, since when (epoch seconds) its oldest event
        not yet applied has waited, None when none waits (streams.rules.feedback_lag)."""
        partitions = sorted(waiting)
        try:
            async with self._pool.connection() as conn:
                await conn.execute(
                    query("report_feedback_progress"),
                    {
                        "topic": self.topic,
                        "partitions": partitions,
                        "waiting": [waiting[p] for p in partitions],
                    },
                )
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc

    async def purge_seen(self, horizon: datetime, limit: int = 10_000) -> int:
        """Delete dedupe ids older than `horizon`, in batches; returns how many."""
        total = 0
        try:
            async with self._pool.connection() as conn:
                while True:
                    cur = await conn.execute(
                        query("purge_feedback_seen"), {"horizon": horizon, "limit": limit}
                    )
                    total += cur.rowcount
                    if cur.rowcount < limit:
                        return total
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc

    async def campaign_feedback(self, campaign_id: int) -> dict[str, Any] | None:
        try:
            async with self._pool.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(query("campaign_feedback"), {"campaign_id": campaign_id})
                return await cur.fetchone()
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc


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
