"""The mail service's consumer side: order events → mail rows, offsets in the same transaction.

`handle(batch)` runs in the Faust agent, serially: decode and parse every record (pure), send
poison to the DLQ at once (unparseable, unknown type or version, a field out of its domain:
retrying would block the partition forever, seed architecture-2 trap 5), then ONE transaction
that advances the fenced offsets and inserts/cancels (MailStore.ingest) and records the
confirmations too old to act on (the replay trap; cancels of any age are applied). Records
below a partition's stored offset are skipped one by one, and nothing of a partition another
worker now owns (a newer epoch) is applied. A database outage is transient: retried here with
backoff and jitter until it comes back, never acknowledged past (trap 1: the offset only moves
with the rows). A batch whose data PostgreSQL refuses (RecordsRejected: a value the checks
did not foresee) is applied again one record at a time, and the record refused alone goes to
the DLQ, so the partition keeps flowing.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from flashsend import metrics
from producers.dlq import DeadLetter, DeadLetterFailed, DeadLetterProducer
from schemas.serde import AvroCodec, SerdeError, wait_for_writer_schemas
from sinks.mail_store import IngestOutcome, MailStore
from sinks.offsets import PartitionSpan, RecordsRejected, StoreUnavailable
from streams.rules.backoff import backoff_delay
from streams.rules.mail_logic import (
    CancelMail,
    Command,
    CreateMail,
    Poison,
    StaleEvent,
    parse_order_event,
)

log = logging.getLogger("flashsend.mail.ingest")


class Record(Protocol):
    """What the ingest needs from a consumed Kafka record (a Faust message fits)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


@dataclass
class IngestStats:
    created: int = 0
    duplicates: int = 0
    cancels: int = 0
    stale: int = 0  # confirmations older than max_age_s: recorded, not mailed
    dead: int = 0
    fenced: int = 0  # records skipped: below the stored offset
    overtaken: int = 0  # partitions of a batch that another worker owns now
    retries: int = 0
    one_by_one: int = 0  # batches PostgreSQL refused, applied again record by record
    by_result: dict[str, int] = field(default_factory=dict)


def parse_record(
    codec: AvroCodec,
    rec: Record,
    *,
    now_ms: int,
    max_age_s: float,
    at_most_once_templates: Sequence[str],
) -> Command | DeadLetter:
    """What one consumed record asks for, or its dead letter. Never raises (its writer schema
    must be cached: `wait_for_writer_schemas`): an unforeseen error in the pure parse is the
    record's fault too, and raising would replay it forever."""
    try:
        event = codec.decode(rec.value)
    except SerdeError as exc:
        return DeadLetter.of(rec, exc.reason, str(exc))
    try:
        parsed = parse_order_event(
            event,
            now_ms=now_ms,
            max_age_s=max_age_s,
            at_most_once_templates=at_most_once_templates,
        )
    except Exception as exc:
        return DeadLetter.of(rec, "unparseable", f"{type(exc).__name__}: {exc}")
    if isinstance(parsed, Poison):
        return DeadLetter.of(rec, parsed.reason, parsed.detail)
    return parsed


class MailIngest:
    def __init__(
        self,
        *,
        store: MailStore,
        codec: AvroCodec,
        dlq: DeadLetterProducer,
        max_age_s: float,
        at_most_once_templates: Sequence[str],
        on_created: Callable[[], None] | None = None,
        retry_cap_s: float = 5.0,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.codec = codec
        self.dlq = dlq
        self.max_age_s = max_age_s
        self.at_most_once = tuple(at_most_once_templates)
        self.on_created = on_created
        self.retry_cap_s = retry_cap_s
        self.rng = rng or random.Random()
        self.stats = IngestStats()

    def parse(self, rec: Record, now_ms: int) -> Command | DeadLetter:
        return parse_record(
            self.codec,
            rec,
            now_ms=now_ms,
            max_age_s=self.max_age_s,
            at_most_once_templates=self.at_most_once,
        )

    async def handle(self, records: Sequence[Record]) -> IngestOutcome | None:
        """Process one consumed batch; returns only once its effects are committed."""
        if not records:
            return None
        self.stats.retries += await wait_for_writer_schemas(
            [self.codec], [r.value for r in records], cap_s=self.retry_cap_s, rng=self.rng
        )
        now_ms = int(time.time() * 1000)
        spans: dict[int, PartitionSpan] = {}
        commands: dict[int, list[tuple[int, Command]]] = {}
        dead: list[DeadLetter] = []
        for rec in records:
            span = spans.get(rec.partition)
            spans[rec.partition] = PartitionSpan(
                rec.partition,
                rec.offset if span is None else min(span.first_offset, rec.offset),
                rec.offset if span is None else max(span.last_offset, rec.offset),
            )
            parsed = self.parse(rec, now_ms)
            if isinstance(parsed, DeadLetter):
                log.warning(
                    "poison record to DLQ: partition=%s offset=%s reason=%s %s",
                    rec.partition,
                    rec.offset,
                    parsed.reason,
                    parsed.detail,
                )
                dead.append(parsed)
                continue
            if isinstance(parsed, StaleEvent):
                self.stats.stale += 1
                metrics.count_stale_event(parsed.event_type)
                log.info(
                    "stale order event, no mail: partition=%s offset=%s dedupe_key=%s %s",
                    rec.partition,
                    rec.offset,
                    parsed.dedupe_key,
                    parsed.reason,
                )
            commands.setdefault(rec.partition, []).append((rec.offset, parsed))
        await self._dead_letter(dead)
        try:
            outcome: IngestOutcome = await self._retry(
                self.store.ingest, list(spans.values()), commands
            )
        except RecordsRejected as exc:
            log.warning("PostgreSQL refused the batch (%s); applying it record by record", exc)
            outcome = await self._one_by_one(records, commands)
        self._account(outcome, commands)
        if outcome.created and self.on_created is not None:
            self.on_created()
        return outcome

    async def _dead_letter(self, dead: list[DeadLetter]) -> None:
        if dead:
            await self._retry(self.dlq.publish, dead)
            self.stats.dead += len(dead)
            metrics.count_dead_letters(self.dlq.topic, (d.reason for d in dead))

    async def _one_by_one(
        self, records: Sequence[Record], commands: dict[int, list[tuple[int, Command]]]
    ) -> IngestOutcome:
        """Each record in its own transaction; one PostgreSQL refuses goes to the DLQ and its
        offset advances with nothing applied. Rare (the field checks come first), so N small
        transactions are fine."""
        self.stats.one_by_one += 1
        by_offset = {(p, off): cmd for p, cs in commands.items() for off, cmd in cs}
        total = IngestOutcome(0, 0, [])
        for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
            span = [PartitionSpan(rec.partition, rec.offset, rec.offset)]
            cmd = by_offset.get((rec.partition, rec.offset))
            mine = {} if cmd is None else {rec.partition: [(rec.offset, cmd)]}
            try:
                outcome = await self._retry(self.store.ingest, span, mine)
            except RecordsRejected as exc:
                await self._dead_letter([DeadLetter.of(rec, "rejected_by_database", str(exc))])
                outcome = await self._retry(self.store.ingest, span, {})
            total = total.plus(outcome)
        return total

    def _account(
        self, outcome: IngestOutcome, commands: dict[int, list[tuple[int, Command]]]
    ) -> None:
        s = self.stats
        s.created += outcome.created
        s.duplicates += outcome.duplicates
        s.cancels += sum(1 for cs in commands.values() for _, c in cs if isinstance(c, CancelMail))
        for _key, result in outcome.cancels:
            s.by_result[str(result)] = s.by_result.get(str(result), 0) + 1
        s.fenced += outcome.fenced
        if outcome.stale:
            s.overtaken += len(outcome.stale)
            log.warning(
                "partitions %s (epochs held here) belong to another worker now: their records "
                "are left to it until the next assignment",
                outcome.stale,
            )
        for cs in commands.values():
            for _, c in cs:
                if isinstance(c, CreateMail):
                    log.debug("mail event_id=%s dedupe_key=%s", c.event_id, c.dedupe_key)

    async def _retry(self, fn: Callable[..., Any], *args: Any) -> Any:
        attempt = 0
        while True:
            try:
                return await fn(*args)
            except RecordsRejected:
                raise  # the same records would fail again: the caller decides
            except (StoreUnavailable, DeadLetterFailed) as exc:
                attempt += 1
                self.stats.retries += 1
                delay = backoff_delay(
                    min(attempt, 10), base=0.1, cap=self.retry_cap_s, rng=self.rng
                )
                log.warning(
                    "%s failed (attempt %d), retrying in %.2fs: %s",
                    getattr(fn, "__name__", fn),
                    attempt,
                    delay,
                    exc,
                )
                await asyncio.sleep(delay)
