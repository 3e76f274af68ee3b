"""The Postgres offset store shared by every consumer (campaign sender, mail service,
feedback): offsets are stored with the effects, in the same transaction (docs/architecture.md §4).

Two fences guard every batch (`PartitionOffsets.transaction`):
- the owner epoch. On assignment a worker takes a new epoch for each partition it got
  (`take`); every advance names the epoch it holds, so a worker that lost the partition (a
  zombie: paused, dropped from the group, resumed) moves nothing and applies nothing, however
  far behind or ahead of the new owner it is;
- the stored next offset. Records below it were applied already and are skipped one by one;
  the rest of the batch is applied (`Fence.keep`).
When the answer to a COMMIT is lost, PostgreSQL is asked whether that transaction committed
(`pg_xact_status` of its id); the caller goes on with exactly what was committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from flashsend.errors import FlashsendError
from sinks.queries import query

log = logging.getLogger("flashsend.offsets")

T = TypeVar("T")
Item = TypeVar("Item")

# A transaction whose COMMIT answer was lost and that is still in progress this long after is
# held open by a backend that never received the COMMIT (a half-open connection): it is ended.
IN_DOUBT_GRACE_S = 1.0
RESOLVE_POLL_S = 0.05
RESOLVE_RETRY_CAP_S = 5.0


class StoreUnavailable(FlashsendError):
    """PostgreSQL could not be reached or the transaction failed; retry with backoff."""


class RecordsRejected(StoreUnavailable):
    """PostgreSQL refused the batch's data (a value out of a column's domain, a key too long
    for its index): retrying the same records fails the same way. A consumer that can apply its
    records one at a time finds the one at fault and dead-letters it; others retry as for any
    StoreUnavailable."""


# SQLSTATE classes that blame the data, not the server: 22 data exception, 23 integrity
# constraint violation, 54 program limit exceeded (an index row too large).
_DATA_CLASSES = ("22", "23", "54")


class TransactionInDoubt(FlashsendError):
    """PostgreSQL no longer knows whether a transaction committed; nothing can be assumed."""


@dataclass(frozen=True)
class PartitionSpan:
    partition: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True)
class Assignment:
    """Partitions of one topic assigned to this worker, with what the broker says of them."""

    topic: str
    partitions: tuple[int, ...]
    new: frozenset[int] | None = None  # just assigned: a new epoch is taken (None: all)
    topic_id: str | None = None  # the topic's Kafka id (None: unknown)
    log_start: Mapping[int, int] = field(default_factory=dict)
    log_end: Mapping[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, topic: str, partitions: Sequence[int]) -> Assignment:
        """All of `partitions` newly assigned, nothing known of their logs."""
        return cls(topic, tuple(sorted(partitions)))


@dataclass(frozen=True)
class Start:
    """Where the new owner of a partition starts, and why if not at the stored offset."""

    next_offset: int
    topic_id: str | None
    why: str | None = None


def start_offset(
    stored: int,
    stored_topic_id: str | None,
    topic_id: str | None,
    log_start: int | None,
    log_end: int | None,
) -> Start:
    """Keep the stored offset unless the log it belongs to is gone.

    - Another topic id: the topic was deleted and created again; its records are all new, so
      the owner starts at the log start.
    - The stored offset is past the log end: the log lost its tail (an unclean leader
      election), or the topic was recreated with fewer records than were consumed. Same topic
      id: every record in the log was applied, start at the log end (below it, new records
      would be fenced off and lost). Otherwise (no id to compare): assume recreated and start
      at the log start; records applied twice are absorbed by every consumer's own dedupe
      (conditional claims, ON CONFLICT, feedback_seen), records skipped would be lost."""
    known = topic_id or stored_topic_id
    start = log_start or 0
    if topic_id is not None and stored_topic_id is not None and topic_id != stored_topic_id:
        return Start(
            start,
            topic_id,
            f"topic recreated (id {stored_topic_id} -> {topic_id}): {stored} -> {start}",
        )
    if log_end is not None and stored > log_end:
        if topic_id is not None and stored_topic_id == topic_id:
            return Start(
                log_end,
                known,
                f"stored offset past the log end of the same topic: {stored} -> {log_end}",
            )
        return Start(
            start,
            known,
            f"stored offset past the log end {log_end}, topic recreated: {stored} -> {start}",
        )
    return Start(stored, known)


@dataclass(frozen=True)
class Fence:
    """What advance_offsets found for each partition of a batch."""

    starts: Mapping[int, int]  # partition -> offset stored before the batch (ours to apply)
    epochs: Mapping[int, int]  # partition -> the epoch the batch was applied under
    stale: Mapping[int, int | None]  # partition -> the epoch held here, no longer the owner's
    xid: str | None = None  # the transaction's id, when it advanced anything

    def keep(
        self, items: Mapping[int, Sequence[tuple[int, Item]]]
    ) -> tuple[dict[int, list[Item]], int]:
        """Of (offset, item) pairs per partition: the items to apply (at or above the stored
        offset of a partition this worker owns), and how many were skipped as applied
        already. Items of stale partitions are in neither."""
        kept: dict[int, list[Item]] = {}
        skipped = 0
        for partition, start in self.starts.items():
            batch = items.get(partition, ())
            fresh = [item for offset, item in batch if offset >= start]
            skipped += len(batch) - len(fresh)
            if fresh:
                kept[partition] = fresh
        return kept, skipped


class PartitionOffsets:
    """One group's stored offsets of one topic, and the epochs this worker holds.

    Takes and fenced transactions of one worker never interleave (one lock): a transaction
    that finds its epoch stale was overtaken by another worker, never by this one."""

    def __init__(self, pool: AsyncConnectionPool, *, group_id: str, topic: str) -> None:
        self._pool = pool
        self.group_id = group_id
        self.topic = topic
        self._epochs: dict[int, int] = {}
        self._lock = asyncio.Lock()

    def epoch(self, partition: int) -> int | None:
        return self._epochs.get(partition)

    async def take(self, assignment: Assignment) -> dict[int, int]:
        """On assignment: a new epoch for each newly assigned partition (and any this worker
        holds none for), where each starts (start_offset), and the stored offset of the
        others. Returns the next offset of every partition of the assignment."""
        new = set(assignment.partitions) if assignment.new is None else set(assignment.new)
        take = sorted(p for p in assignment.partitions if p in new or p not in self._epochs)
        rest = sorted(set(assignment.partitions) - set(take))
        params = {"group_id": self.group_id, "topic": self.topic}
        offsets: dict[int, int] = {}
        taken: dict[int, int] = {}
        async with self._lock:
            try:
                async with self._pool.connection() as conn, conn.transaction():
                    if take:
                        cur = await conn.execute(
                            query("take_partitions"), {**params, "partitions": take}
                        )
                        restarts: list[tuple[int, int, Start]] = []
                        for p, stored, epoch, stored_id in await cur.fetchall():
                            start = start_offset(
                                int(stored),
                                stored_id,
                                assignment.topic_id,
                                assignment.log_start.get(p),
                                assignment.log_end.get(p),
                            )
                            if start.why is not None:
                                log.warning(
                                    "%s[%s] group %s: %s", self.topic, p, self.group_id, start.why
                                )
                            if start.next_offset != stored or start.topic_id != stored_id:
                                restarts.append((int(p), int(epoch), start))
                            offsets[int(p)] = start.next_offset
                            taken[int(p)] = int(epoch)
                        if restarts:
                            await conn.execute(
                                query("restart_offsets"),
                                {
                                    **params,
                                    "partitions": [p for p, _, _ in restarts],
                                    "epochs": [e for _, e, _ in restarts],
                                    "next_offsets": [s.next_offset for _, _, s in restarts],
                                    "topic_ids": [s.topic_id for _, _, s in restarts],
                                },
                            )
                    if rest:
                        cur = await conn.execute(
                            query("load_offsets"), {**params, "partitions": rest}
                        )
                        offsets.update({int(p): int(o) for p, o in await cur.fetchall()})
            except psycopg.Error as exc:
                raise StoreUnavailable(str(exc)) from exc
            self._epochs.update(taken)
        if taken:
            log.info("%s group %s: took partitions (epochs) %s", self.topic, self.group_id, taken)
        return offsets

    async def advance(
        self, conn: psycopg.AsyncConnection[Any], spans: Sequence[PartitionSpan]
    ) -> Fence:
        """advance_offsets inside the caller's transaction, under the epochs held here."""
        ordered = sorted(spans, key=lambda s: s.partition)  # rows locked in one order
        held = {s.partition: self._epochs.get(s.partition) for s in ordered}
        asked = [s for s in ordered if held[s.partition] is not None]
        rows: list[tuple[Any, ...]] = []
        if asked:
            cur = await conn.execute(
                query("advance_offsets"),
                {
                    "group_id": self.group_id,
                    "topic": self.topic,
                    "partitions": [s.partition for s in asked],
                    "epochs": [held[s.partition] for s in asked],
                    "last_offsets": [s.last_offset for s in asked],
                },
            )
            rows = await cur.fetchall()
        starts = {int(p): int(o) for p, o, _ in rows}
        return Fence(
            starts=starts,
            epochs={p: e for p, e in held.items() if p in starts and e is not None},
            stale={p: e for p, e in held.items() if p not in starts},
            xid=str(rows[0][2]) if rows else None,
        )

    async def transaction(
        self,
        spans: Sequence[PartitionSpan],
        apply: Callable[[psycopg.AsyncConnection[Any], Fence], Awaitable[T]],
    ) -> T:
        """ONE transaction: advance the offsets of `spans`, then `apply(conn, fence)` applies
        the records the fence keeps; returns apply's result once committed.

        If the connection breaks while COMMIT is in flight, the transaction may or may not
        have committed. It is never retried blindly (its records would be fenced off as
        applied, and what it returned lost): PostgreSQL is asked. Committed: apply's result
        is returned as if the answer had arrived. Not committed: StoreUnavailable, and the
        caller's retry applies the records afresh."""
        async with self._lock:
            in_doubt: tuple[str, int, psycopg.Error] | None = None
            try:
                async with self._pool.connection() as conn:
                    pid = conn.info.backend_pid
                    fence: Fence | None = None
                    committing = False
                    try:
                        async with conn.transaction():
                            fence = await self.advance(conn, spans)
                            result = await apply(conn, fence)
                            committing = True
                    except psycopg.Error as exc:
                        # An answer from the server (sqlstate) means COMMIT failed; no answer
                        # after COMMIT was sent means nobody knows yet. With no xid nothing
                        # was advanced, so nothing was applied: a retry is exact.
                        if not committing or exc.sqlstate is not None or fence is None:
                            raise
                        if fence.xid is None:
                            raise
                        in_doubt = (fence.xid, pid, exc)
            except psycopg.Error as exc:
                if (exc.sqlstate or "")[:2] in _DATA_CLASSES:
                    raise RecordsRejected(str(exc)) from exc
                raise StoreUnavailable(str(exc)) from exc
            if in_doubt is None:
                return result
            xid, pid, cause = in_doubt
            if await self._committed(xid, pid, cause):
                return result
            raise StoreUnavailable(f"transaction {xid} did not commit: {cause}")

    async def _committed(self, xid: str, pid: int, cause: psycopg.Error) -> bool:
        """Whether transaction `xid` (run by backend `pid`) committed, once that is final."""
        log.warning(
            "%s group %s: the answer to COMMIT of transaction %s was lost (%s); asking PostgreSQL",
            self.topic,
            self.group_id,
            xid,
            str(cause).strip(),
        )
        loop = asyncio.get_running_loop()
        began = loop.time()
        delay = RESOLVE_POLL_S
        while True:
            status: str | None = "unreachable"
            try:
                async with self._pool.connection() as conn:
                    cur = await conn.execute(query("transaction_status"), {"xid": xid})
                    row = await cur.fetchone()
                    status = None if row is None else row[0]
                    if status == "in progress" and loop.time() - began >= IN_DOUBT_GRACE_S:
                        await conn.execute(
                            query("end_transaction_backend"), {"pid": pid, "xid": xid}
                        )
            except psycopg.Error as exc:
                log.warning("asking about transaction %s failed, asking again: %s", xid, exc)
                delay = min(RESOLVE_RETRY_CAP_S, delay * 2)
            if status in ("committed", "aborted"):
                log.warning("transaction %s with the lost COMMIT answer: %s", xid, status)
                return status == "committed"
            if status is None:
                raise TransactionInDoubt(f"PostgreSQL no longer knows transaction {xid}")
            await asyncio.sleep(delay)
