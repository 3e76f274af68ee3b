"""The feedback agent as its own Faust app (`flashsend worker --role feedback`).

Consumes mail.events; every batch is one PostgreSQL transaction that advances this group's
fenced offsets (kafka_offsets, group = the app id) together with the suppressions, the
per-campaign counters and any automatic pause (streams.feedback_ingest, sinks.feedback_store).
The `pgkafka://` transport seeks to those offsets on every assignment, as for the sender.
Start several for fail-over; the partitions of mail.events bound the parallelism.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

import faust
from faust.types import TP
from psycopg_pool import AsyncConnectionPool

from flashsend import deliverability, health, metrics
from flashsend.logs import logging_config
from flashsend.settings import Settings
from producers.dlq import DeadLetterProducer
from producers.mail_topics import ensure_mail_topics
from schemas import serde
from sinks import metrics_state
from sinks.feedback_store import FeedbackStore
from sinks.offsets import Assignment, StoreUnavailable
from streams import faust_offsets
from streams.feedback_ingest import FeedbackIngest, Prepared
from streams.rules.feedback_lag import REPORT_EVERY_S

log = logging.getLogger("flashsend.feedback.app")

# Records of one fetch, one transaction: large enough that a batch's fixed costs (the
# transaction, the statements' plans, the offset fence) are a small part of each event's.
MAX_POLL_RECORDS = 8000
FAUST_STALL_CHECKS_OFF_S = 10 * 365 * 86400.0
PURGE_EVERY_S = 3600.0


class FeedbackRuntime:
    """Resources of one feedback worker, created lazily inside its event loop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = asyncio.Lock()
        self.pool: AsyncConnectionPool | None = None
        self.store: FeedbackStore | None = None
        self.ingest: FeedbackIngest | None = None
        self._purge_task: asyncio.Task[None] | None = None

    async def ensure_started(self) -> FeedbackIngest:
        async with self._lock:
            if self.ingest is not None:
                return self.ingest
            s = self.settings
            pool = AsyncConnectionPool(
                s.pg_dsn, min_size=1, max_size=4, open=False, kwargs={"autocommit": True}
            )
            await pool.open(wait=True, timeout=60)
            self.pool = pool
            self.store = FeedbackStore(
                pool,
                group_id=deliverability.feedback_app_id(s),
                topic=s.topic_mail_events,
                thresholds=deliverability.thresholds(s),
            )
            self.ingest = FeedbackIngest(
                store=self.store,
                ses_codec=serde.codec(s, "ses_event"),
                unsubscribed_codec=serde.codec(s, "unsubscribed"),
                dlq=DeadLetterProducer(s.kafka_bootstrap, s.topic_dlq),
            )
            self._purge_task = asyncio.create_task(self._purge_loop(), name="feedback-purge")
            health.PROBE.expect(health.ASSIGNED)  # /readyz: after the first assignment's seek
            health.start_heartbeat()  # /healthz
            await asyncio.to_thread(metrics_state.start, s, "feedback")  # /metrics
            return self.ingest

    async def offsets(self, assignment: Assignment) -> Mapping[int, int]:
        """The transport's offset source: take the assigned partitions (sinks.offsets).
        PostgreSQL being down or restarting is waited out: an error here crashes the worker
        (Faust's recovery), and its unapplied events would wait for a restart."""
        ingest = await self.ensure_started()
        assert self.store is not None
        if assignment.topic != self.store.topic:
            return {}
        starts = await faust_offsets.take_waiting(self.store.offsets, assignment)
        ingest.progress.assigned(starts)
        return starts

    async def report_lag(self, consumer: Any) -> None:
        """The lag report campaign workers hold their calls on (streams.rules.feedback_lag)."""
        if self.store is None or self.ingest is None:
            return
        progress = self.ingest.progress
        ends = {p: _highwater(consumer, self.store.topic, p) for p in progress.partitions()}
        report = progress.report(ends, time.time())
        if not report:
            return
        try:
            await self.store.report_progress(report)
        except StoreUnavailable as exc:  # the next report, half a second later, says the same
            log.debug("feedback lag report failed: %s", exc)

    async def _purge_loop(self) -> None:
        while True:
            try:
                horizon = time.time() - self.settings.feedback_dedupe_retention_s
                assert self.store is not None
                purged = await self.store.purge_seen(datetime.fromtimestamp(horizon, tz=UTC))
                if purged:
                    log.info("purged %d feedback dedupe ids", purged)
            except Exception as exc:  # housekeeping never takes the worker down
                log.warning("feedback purge failed: %s", exc)
            await asyncio.sleep(PURGE_EVERY_S)

    async def stop(self) -> None:
        if self._purge_task is not None:
            self._purge_task.cancel()
            with contextlib.suppress(BaseException):
                await self._purge_task
        if self.pool is not None:
            await self.pool.close()


def _highwater(consumer: Any, topic: str, partition: int) -> int | None:
    """The partition's end offset as of the consumer's last fetch; None when unknown here."""
    try:
        end = consumer.highwater(TP(topic, partition))
    except Exception:  # not assigned here (any more), or the consumer not started yet
        return None
    return None if end is None else int(end)


class FeedbackApp(faust.App):  # type: ignore[misc,unused-ignore]
    runtime: FeedbackRuntime
    offset_source: Any
    managed_topics: set[str]
    batch_handler: Any


def create_feedback_app(settings: Settings) -> FeedbackApp:
    app_id = deliverability.feedback_app_id(settings)
    app = FeedbackApp(
        app_id,
        **faust_offsets.app_options(
            settings,
            app_id,
            settings.order_events_partitions,
            broker_commit_every=1000,
            producer_linger_ms=5,
            broker_max_poll_records=MAX_POLL_RECORDS,
            # The records never pass through Faust's stream or its acks (the batch loop):
            # Faust's stall checks would log a working agent as stuck every few minutes. Its
            # health is the lag it reports (streams/rules/feedback_lag.py).
            stream_processing_timeout=FAUST_STALL_CHECKS_OFF_S,
        ),
    )
    runtime = FeedbackRuntime(settings)
    app.runtime = runtime
    app.offset_source = runtime.offsets
    app.managed_topics = {settings.topic_mail_events}

    mail_events = app.topic(
        settings.topic_mail_events,
        partitions=settings.order_events_partitions,
        value_serializer="raw",
        key_serializer="raw",
        internal=False,
    )

    class OnBatch:
        """The consumer's batch handler: the ingest's two stages; a failure stops the
        worker, as consume_batches does (the stored offsets make the restart exact)."""

        async def prepare(self, records: list[faust_offsets.Consumed]) -> Any:
            ingest = await runtime.ensure_started()
            try:
                return await ingest.prepare(records)
            except Exception:
                self.crash()
                raise

        async def commit(self, prepared: Prepared | None) -> None:
            if prepared is None:
                return
            assert runtime.ingest is not None
            try:
                await runtime.ingest.commit(prepared)
            except Exception:
                self.crash()
                raise
            metrics.count_ingested(settings.topic_mail_events, len(prepared.records))

        def crash(self) -> None:
            log.exception("feedback batch failed; stopping the worker")
            app._crash(RuntimeError("feedback batch failed"))

    # Whole fetches go to the handler (faust_offsets.PgOffsetsConsumer._drain_batches); the
    # agent only subscribes the topic and starts the runtime.
    app.batch_handler = OnBatch()

    @app.agent(mail_events, name="feedback")
    async def feedback(stream: faust.StreamT[bytes]) -> AsyncIterator[None]:
        await runtime.ensure_started()
        async for _ in stream:  # never fed: the batch loop takes every record
            yield None

    @app.timer(REPORT_EVERY_S)  # type: ignore[untyped-decorator]
    async def report_lag() -> None:
        await runtime.report_lag(app.consumer)

    @app.on_before_shutdown.connect  # type: ignore[misc,arg-type,unused-ignore]
    async def _stop_runtime(app: faust.App, **kwargs: Any) -> None:
        await runtime.stop()

    return app


def run_feedback_worker(settings: Settings, loglevel: str) -> int:
    """`flashsend worker --role feedback`."""
    from flashsend.faust_worker import BoundedShutdownWorker

    deliverability.thresholds(settings)  # refuse nonsense thresholds before joining the group
    serde.check_registered(settings, ("ses_event", "unsubscribed"))
    ensure_mail_topics(settings)
    (settings.state_dir / "faust").mkdir(parents=True, exist_ok=True)
    app = create_feedback_app(settings)
    worker = BoundedShutdownWorker(
        app,
        grace_s=settings.worker_shutdown_grace_s,
        exit_with_parent=settings.worker_exit_with_parent,
        loglevel=loglevel,
        quiet=True,
        redirect_stdouts=False,
        workdir=str(settings.state_dir / "faust"),
        logging_config=logging_config(settings.log_format, loglevel),
    )
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    worker.execute_from_commandline()
    return 0  # not reached
