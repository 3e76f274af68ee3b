"""The feedback agent's batch handler: mail.events records → effects → one transaction.

mail.events is shared. The `flashsend.schema` header says whose a record is:
- `ses_event` (the SNS webhook: SES events, and SMS events in the same contract) and
  `unsubscribed` (the webhook's outbox) are ours: decoded, turned into effects (pure,
  `streams.rules.feedback_logic`, `streams.rules.sms_feedback`); one of ours that cannot be decoded
  goes to the DLQ at once (a poison record must not block the partition);
- anything else — the transactional mail service's `mail_lifecycle` events, or a schema added
  later by someone else — is not ours: skipped and counted, never dead-lettered. Its offset still
  advances with the batch.

A record of ours with a field outside its domain (streams.rules.field_domains) is poison too. A
batch whose data PostgreSQL refuses anyway (RecordsRejected) is applied again one record at a time;
the record refused alone goes to the DLQ. A schema registry that does not answer is waited out
(schemas.serde.wait_for_writer_schemas), never taken for poison.

Records below a partition's stored offset are skipped one by one (applied before), and nothing
of a partition another worker now owns (a newer epoch) is applied (sinks.offsets).
A database or DLQ outage is retried here with backoff and jitter, never acknowledged past: the
offsets only move with the effects (Faust acks the batch whatever happens, so giving up would
skip it; see docs/architecture.md §4).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flashsend import metrics
from producers.dlq import DeadLetter, DeadLetterFailed, DeadLetterProducer
from schemas.serde import AvroCodec, SerdeError, wait_for_writer_schemas
from sinks.feedback_store import ApplyOutcome, FeedbackStore
from sinks.offsets import PartitionSpan, RecordsRejected, StoreUnavailable
from streams.mail_ingest import Record
from streams.rules.backoff import backoff_delay
from streams.rules.feedback_lag import ProgressTracker
from streams.rules.feedback_logic import FeedbackEffect, record_problem, unsubscribe_effect
from streams.rules.sms_feedback import event_effect

log = logging.getLogger("flashsend.feedback")

SCHEMA_HEADER = "flashsend.schema"
# Records decoded between two turns of the event loop (~20-40 ms of CPU).
YIELD_EVERY = 500


def header(rec: Any, name: str) -> str | None:
    """A header of a consumed record (Faust gives a list of pairs or a mapping)."""
    headers = getattr(rec, "headers", None) or []
    items = headers.items() if hasattr(headers, "items") else headers
    for key, value in items:
        if key == name and value is not None:
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return None


EFFECTS: dict[str, Callable[[Any], FeedbackEffect]] = {
    "ses_event": event_effect,  # SES events, and SMS events in the same contract
    "unsubscribed": unsubscribe_effect,
}


def parse_feedback_record(
    schema: str, codec: AvroCodec, rec: Record
) -> FeedbackEffect | DeadLetter:
    """The effect of one of our records (`schema` in EFFECTS), or its dead letter. Never
    raises (its writer schema must be cached: `wait_for_writer_schemas`)."""
    try:
        record = codec.decode(rec.value)
        problem = record_problem(schema, record)
        if problem is None:
            return EFFECTS[schema](record)
        reason, detail = problem
    except SerdeError as exc:
        reason, detail = exc.reason, str(exc)
    except Exception as exc:  # a bug in the pure parse must not replay the record forever
        reason, detail = "bad_record", f"{type(exc).__name__}: {exc}"
    return DeadLetter.of(rec, reason, detail)


@dataclass
class Prepared:
    """A decoded batch, not applied yet (FeedbackIngest.prepare, then commit)."""

    records: Sequence[Record]
    spans: dict[int, PartitionSpan] = field(default_factory=dict)
    effects: dict[int, list[tuple[int, FeedbackEffect]]] = field(default_factory=dict)
    dead: list[DeadLetter] = field(default_factory=list)
    stamps: dict[int, float | None] = field(default_factory=dict)  # newest record's timestamp


class FeedbackIngest:
    def __init__(
        self,
        *,
        store: FeedbackStore,
        ses_codec: AvroCodec,
        unsubscribed_codec: AvroCodec,
        dlq: DeadLetterProducer,
        retry_cap_s: float = 5.0,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.decoders: dict[str, tuple[AvroCodec, Callable[[Any], FeedbackEffect]]] = {
            "ses_event": (ses_codec, EFFECTS["ses_event"]),
            "unsubscribed": (unsubscribed_codec, EFFECTS["unsubscribed"]),
        }
        self.dlq = dlq
        self.retry_cap_s = retry_cap_s
        self.rng = rng or random.Random()
        self.stats: Counter[str] = Counter()
        self.progress = ProgressTracker()  # what the lag reports are made of

    def parse(self, rec: Record) -> FeedbackEffect | DeadLetter | None:
        """The record's effect; a DeadLetter for our own unreadable ones; None: not ours."""
        schema = header(rec, SCHEMA_HEADER)
        decoder = self.decoders.get(schema or "")
        if schema is None or decoder is None:
            self.stats[f"skipped:{schema or 'no_header'}"] += 1
            return None
        codec, _ = decoder
        return parse_feedback_record(schema, codec, rec)

    async def handle(self, records: Sequence[Record]) -> ApplyOutcome | None:
        """Process one consumed batch; returns only once its effects are committed."""
        batch = await self.prepare(records)
        return None if batch is None else await self.commit(batch)

    async def prepare(self, records: Sequence[Record]) -> Prepared | None:
        """Decode a batch and compute its effects (pure but for the registry look-up), so the
        next batch can be read while the previous one's transaction is in PostgreSQL."""
        if not records:
            return None
        self.stats["registry_retries"] += await wait_for_writer_schemas(
            [codec for codec, _ in self.decoders.values()],
            [r.value for r in records],
            cap_s=self.retry_cap_s,
            rng=self.rng,
        )
        batch = Prepared(records)
        spans, effects, stamps = batch.spans, batch.effects, batch.stamps
        for i, rec in enumerate(records, 1):
            if i % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # the lag report and the health probe keep their beat
            partition, offset = rec.partition, rec.offset
            span = spans.get(partition)
            if span is None:
                spans[partition] = PartitionSpan(partition, offset, offset)
                stamps[partition] = getattr(rec, "timestamp", None)
            elif offset > span.last_offset:
                spans[partition] = PartitionSpan(partition, span.first_offset, offset)
                stamps[partition] = getattr(rec, "timestamp", None)
            elif offset < span.first_offset:
                spans[partition] = PartitionSpan(partition, offset, span.last_offset)
            parsed = self.parse(rec)
            if isinstance(parsed, DeadLetter):
                log.warning(
                    "poison feedback record to DLQ: partition=%s offset=%s reason=%s %s",
                    partition,
                    offset,
                    parsed.reason,
                    parsed.detail,
                )
                batch.dead.append(parsed)
            elif parsed is not None:
                effects.setdefault(partition, []).append((offset, parsed))
        return batch

    async def commit(self, batch: Prepared) -> ApplyOutcome:
        """Dead-letter the batch's poison, then apply its effects with its offsets in one
        transaction; returns once committed."""
        spans, effects = batch.spans, batch.effects
        await self._dead_letter(batch.dead)
        try:
            outcome: ApplyOutcome = await self._retry(
                self.store.apply, list(spans.values()), effects
            )
        except RecordsRejected as exc:
            log.warning("PostgreSQL refused the batch (%s); applying it record by record", exc)
            outcome = await self._one_by_one(batch.records, effects)
        for span in spans.values():
            if span.partition in outcome.stale:
                self.progress.forget(span.partition)
            else:
                self.progress.applied(
                    span.partition, span.last_offset, batch.stamps[span.partition]
                )
        self._account(outcome)
        metrics.count_feedback_effects(
            (e.campaign_id, e.counter) for es in effects.values() for _, e in es
        )
        return outcome

    async def _dead_letter(self, dead: list[DeadLetter]) -> None:
        if dead:
            await self._retry(self.dlq.publish, dead)
            self.stats["dead"] += len(dead)
            metrics.count_dead_letters(self.dlq.topic, (d.reason for d in dead))

    async def _one_by_one(
        self, records: Sequence[Record], effects: dict[int, list[tuple[int, FeedbackEffect]]]
    ) -> ApplyOutcome:
        """Each record in its own transaction; one PostgreSQL refuses goes to the DLQ and its
        offset advances with nothing applied (rare: the field checks come first)."""
        self.stats["one_by_one"] += 1
        by_offset = {(p, off): e for p, es in effects.items() for off, e in es}
        total = ApplyOutcome()
        for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
            span = [PartitionSpan(rec.partition, rec.offset, rec.offset)]
            effect = by_offset.get((rec.partition, rec.offset))
            mine = {} if effect is None else {rec.partition: [(rec.offset, effect)]}
            try:
                outcome = await self._retry(self.store.apply, span, mine)
            except RecordsRejected as exc:
                await self._dead_letter([DeadLetter.of(rec, "rejected_by_database", str(exc))])
                outcome = await self._retry(self.store.apply, span, {})
            total = total.plus(outcome)
        return total

    def _account(self, outcome: ApplyOutcome) -> None:
        self.stats["applied"] += outcome.fresh
        self.stats["suppressed"] += outcome.suppressed
        metrics.count_suppressions("feedback", outcome.suppressed)
        self.stats["fenced"] += outcome.fenced
        self.stats["resolved"] += outcome.resolved
        if outcome.stale:
            self.stats["overtaken"] += len(outcome.stale)
            log.warning(
                "partitions %s (epochs held here) belong to another worker now: their records "
                "are left to it until the next assignment",
                outcome.stale,
            )
        for campaign_id, reason in outcome.paused:
            self.stats["paused"] += 1
            log.warning("ALERT campaign %s paused automatically: %s", campaign_id, reason)
        for campaign_id, status, reason in outcome.over_threshold:
            if self.stats[f"alerted:{campaign_id}"] == 0:
                log.warning(
                    "ALERT campaign %s (%s) is over a threshold: %s", campaign_id, status, reason
                )
            self.stats[f"alerted:{campaign_id}"] += 1

    async def _retry(self, fn: Callable[..., Any], *args: Any) -> Any:
        attempt = 0
        while True:
            try:
                return await fn(*args)
            except RecordsRejected:
                raise  # the same records would fail again: the caller decides
            except (StoreUnavailable, DeadLetterFailed) as exc:
                attempt += 1
                self.stats["retries"] += 1
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
