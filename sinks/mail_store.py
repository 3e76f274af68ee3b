"""MailStore: the mail service's view of its database, one method per named statement.

Every transition that ends a mail's life writes its lifecycle events into `mail_outbox` in the
same transaction (`_emit`), so the order service hears about it even if the worker dies right
after. psycopg errors are translated into `StoreUnavailable` (retry later) here, so stream code
never sees a driver exception.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from sinks.offsets import Fence, PartitionOffsets, PartitionSpan, StoreUnavailable
from sinks.queries import query
from streams.rules.mail_logic import (
    CancelMail,
    CancelResult,
    Command,
    CreateMail,
    StaleEvent,
    cancel_events,
    cancel_result,
    lifecycle_events,
)

__all__ = ["Claim", "ClaimedMail", "IngestOutcome", "MailStore", "StoreUnavailable", "Transition"]


@dataclass(frozen=True)
class ClaimedMail:
    id: int
    dedupe_key: str
    ref: str | None
    event_id: str | None
    token: int  # attempts after the claim: the fencing token
    send_errors: int
    to_email: str
    template: str
    data: dict[str, Any]
    delivery: str
    created_at: datetime
    occurred_at: datetime | None


@dataclass(frozen=True)
class Transition:
    """A row as a transition statement returned it (RETURNING of the mark_* statements)."""

    id: int
    dedupe_key: str
    ref: str | None
    status: str
    cancel_requested: bool
    attempts: int
    provider_id: str | None


@dataclass(frozen=True)
class Claim:
    """One claim: the rows to send now, and the rows it ended because their address is
    suppressed (status suppressed/unknown, last_error 'suppressed:<reason>', EmailFailed
    written)."""

    mails: list[ClaimedMail]
    suppressed: list[tuple[Transition, str]]  # (the ended row, the suppression reason)


@dataclass(frozen=True)
class IngestOutcome:
    created: int
    duplicates: int
    cancels: list[tuple[str, CancelResult]]
    fenced: int = 0  # records below the stored offset: applied before
    stale: dict[int, int | None] = field(default_factory=dict)  # partition -> epoch held here
    stale_events: int = 0  # confirmations too old to act on, recorded now (not seen before)

    def plus(self, other: IngestOutcome) -> IngestOutcome:
        """Two outcomes as one (a batch applied in parts)."""
        return IngestOutcome(
            self.created + other.created,
            self.duplicates + other.duplicates,
            self.cancels + other.cancels,
            self.fenced + other.fenced,
            {**self.stale, **other.stale},
            self.stale_events + other.stale_events,
        )


def lifecycle_params(
    topic: str, rows: Sequence[tuple[Transition, str, str | None]]
) -> dict[str, Any] | None:
    """Parameters of insert_lifecycle_events for (row, event_type, reason) triples."""
    if not rows:
        return None
    return {
        "topic": topic,
        "msg_keys": [r.ref or r.dedupe_key for r, _, _ in rows],
        "event_types": [t for _, t, _ in rows],
        "dedupe_keys": [r.dedupe_key for r, _, _ in rows],
        "payloads": [
            json.dumps(
                {
                    "ref": r.ref,
                    "mail_status": r.status,
                    "message_id": r.provider_id,
                    "reason": reason,
                    "attempts": r.attempts,
                }
            )
            for r, _, reason in rows
        ],
    }


def transition_events(
    rows: Sequence[Transition], reason: str | None
) -> list[tuple[Transition, str, str | None]]:
    return [(r, t, reason) for r in rows for t in lifecycle_events(r.status, r.cancel_requested)]


def create_params(cmd: CreateMail) -> dict[str, Any]:
    return {
        "event_id": cmd.event_id,
        "dedupe_key": cmd.dedupe_key,
        "ref": cmd.ref,
        "to_email": cmd.to_email,
        "template": cmd.template,
        "data": Jsonb(cmd.data),
        "delivery": str(cmd.delivery),
        "send_after": cmd.send_after,
        "occurred_at": cmd.occurred_at,
    }


def stale_params(cmd: StaleEvent) -> dict[str, Any]:
    return {
        "event_id": cmd.event_id,
        "dedupe_key": cmd.dedupe_key,
        "ref": cmd.ref,
        "event_type": cmd.event_type,
        "occurred_at": cmd.occurred_at,
        "age_s": cmd.age_s,
    }


def cancel_params(cmd: CancelMail) -> dict[str, Any]:
    return {"keys": cmd.keys, "ref": cmd.ref, "cancel_event_id": cmd.event_id}


def cancel_outcome(
    returned: Sequence[tuple[Any, ...]],
) -> tuple[list[tuple[str, CancelResult]], list[tuple[Transition, str, str | None]]]:
    """Classify the RETURNING rows of cancel_mail and list the events to publish."""
    results: list[tuple[str, CancelResult]] = []
    events: list[tuple[Transition, str, str | None]] = []
    for mail_id, key, ref, status, old_status, tombstone, attempts, provider_id in returned:
        result = cancel_result(old_status, bool(tombstone))
        results.append((key, result))
        row = Transition(mail_id, key, ref, status, True, attempts, provider_id)
        events += [(row, t, f"cancel:{result}") for t in cancel_events(result)]
    return results, events


class MailStore:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        group_id: str,
        topic: str,
        lifecycle_topic: str,
        suppression_exempt: Sequence[str] = (),
    ) -> None:
        self._pool = pool
        # Templates a bounce or complaint suppression does not block (legally required mail).
        self.suppression_exempt = list(suppression_exempt)
        self.group_id = group_id
        self.topic = topic
        self.lifecycle_topic = lifecycle_topic
        self.offsets = PartitionOffsets(pool, group_id=group_id, topic=topic)

    async def ingest(
        self, spans: Sequence[PartitionSpan], commands: dict[int, list[tuple[int, Command]]]
    ) -> IngestOutcome:
        """Advance the fenced offsets and apply the (offset, command) pairs the fence keeps, in
        offset order, in ONE transaction: the rows and the offsets commit together or not at
        all, so a crash anywhere replays the batch and the ON CONFLICTs absorb it."""

        async def apply(conn: psycopg.AsyncConnection[Any], fence: Fence) -> IngestOutcome:
            kept, fenced = fence.keep(commands)
            created = duplicates = stale_events = 0
            cancels: list[tuple[str, CancelResult]] = []
            events: list[tuple[Transition, str, str | None]] = []
            for partition in sorted(kept):
                for cmd in kept[partition]:
                    if isinstance(cmd, CreateMail):
                        cur = await conn.execute(query("insert_mail"), create_params(cmd))
                        if await cur.fetchone():
                            created += 1
                        else:
                            duplicates += 1
                    elif isinstance(cmd, StaleEvent):
                        cur = await conn.execute(query("record_stale_event"), stale_params(cmd))
                        stale_events += 1 if await cur.fetchone() else 0
                    else:
                        cur = await conn.execute(query("cancel_mail"), cancel_params(cmd))
                        results, evs = cancel_outcome(await cur.fetchall())
                        cancels += results
                        events += evs
            await self._emit(conn, events)
            return IngestOutcome(
                created, duplicates, cancels, fenced, dict(fence.stale), stale_events
            )

        return await self.offsets.transaction(spans, apply)

    async def claim(self, limit: int, lease_s: float) -> list[ClaimedMail]:
        """The rows to send now (see claim_batch; suppressed rows are ended there)."""
        return (await self.claim_batch(limit, lease_s)).mails

    async def claim_batch(self, limit: int, lease_s: float) -> Claim:
        """Claim up to `limit` due rows. Rows whose address is suppressed (bounce, complaint,
        manual) are ended by the same statement instead, and their EmailFailed is written in
        the same short transaction; the caller only ever sees them as `suppressed`."""
        try:
            async with self._pool.connection() as conn, conn.transaction():
                cur = await conn.execute(
                    query("claim_due_mail"),
                    {"limit": limit, "lease_s": lease_s, "exempt": self.suppression_exempt},
                )
                mails: list[ClaimedMail] = []
                ended: list[tuple[Transition, str]] = []
                events: list[tuple[Transition, str, str | None]] = []
                for row in await cur.fetchall():
                    mail = ClaimedMail(*row[:12])
                    reason, status, cancel_requested, provider_id = row[12:]
                    if reason is None:
                        mails.append(mail)
                        continue
                    done = Transition(
                        mail.id,
                        mail.dedupe_key,
                        mail.ref,
                        status,
                        cancel_requested,
                        mail.token,
                        provider_id,
                    )
                    ended.append((done, str(reason)))
                    events += transition_events([done], f"suppressed:{reason}")
                await self._emit(conn, events)
                return Claim(mails, ended)
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc

    async def transition(
        self, statement: str, params: dict[str, Any], reason: str | None
    ) -> Transition | None:
        """Run one mark_* statement (fenced by the token) and emit its lifecycle events in the
        same transaction. None: the token no longer matches (someone else owns the row)."""
        try:
            async with self._pool.connection() as conn, conn.transaction():
                cur = await conn.execute(query(statement), params)
                row = await cur.fetchone()
                if row is None:
                    return None
                done = Transition(*row)
                await self._emit(conn, transition_events([done], reason))
                return done
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc

    async def expire_leases(self) -> list[Transition]:
        try:
            async with self._pool.connection() as conn, conn.transaction():
                cur = await conn.execute(query("expire_mail_leases"))
                rows = [Transition(*r) for r in await cur.fetchall()]
                await self._emit(conn, transition_events(rows, "lease_expired"))
                return rows
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc

    async def next_due(self) -> datetime | None:
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(query("next_mail_due"))
                row = await cur.fetchone()
                return row[0] if row else None
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc

    async def purge(self, horizon: datetime, limit: int = 1000) -> int:
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(query("purge_mail"), {"horizon": horizon, "limit": limit})
                purged = cur.rowcount
                await conn.execute(query("purge_mail_outbox"), {"horizon": horizon, "limit": limit})
                await conn.execute(
                    query("purge_mail_stale_events"), {"horizon": horizon, "limit": limit}
                )
                return purged
        except psycopg.Error as exc:
            raise StoreUnavailable(str(exc)) from exc

    async def _emit(
        self,
        conn: psycopg.AsyncConnection[Any],
        events: Sequence[tuple[Transition, str, str | None]],
    ) -> None:
        params = lifecycle_params(self.lifecycle_topic, events)
        if params is not None:
            await conn.execute(query("insert_lifecycle_events"), params)
