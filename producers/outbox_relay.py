"""The outbox relay: publishes the rows of an outbox table to Kafka, in id order, exactly one
relay active per outbox.

Why each rule (seed, architecture 2):
- ONE relay, through a session-level Postgres advisory lock (`pg_try_advisory_lock`), not
  SKIP LOCKED workers: two relays would publish 1–100 and 101–200 concurrently and an
  OrderCancelled could overtake its OrderConfirmed (trap 7). A relay whose connection dies
  loses the lock with it, so there is never an orphaned lock. The lock lives on one session:
  the relay checks its backend pid every pass and stops if a pooler (PgBouncer in transaction
  mode) swapped the session under it (trap 9).
- No transaction is ever open while waiting for the broker (trap 8): the batch is read with
  one autocommit SELECT, produced, acked, and each acked row is then marked published with its
  own autocommit UPDATE. A crash between ack and mark republishes the row with the SAME
  event_id (generated when the row was written, trap 2), which consumers deduplicate.
- Failures: broker unreachable / ack timeout is transient (back off, the row keeps its budget,
  or a 20-minute outage would kill every event); a failure of the message itself (too large,
  does not fit its schema) counts, and after `max_failures` the row is marked dead with an
  ALERT log line so it cannot block the outbox forever. Publishing stops at the first failure
  of a batch and resumes from it: order is kept.
- The ack timeout (`publish_timeout_s`) must exceed the broker's p99 ack latency (trap 10),
  or nearly every event is published twice.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException, Producer
from psycopg import sql

from flashsend import metrics
from flashsend.errors import FlashsendError
from schemas.serde import AvroCodec, registry_client
from sinks.queries import query
from streams.rules.backoff import backoff_delay

log = logging.getLogger("flashsend.relay")

_TRANSIENT_CODES = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError._QUEUE_FULL,
    }
)


def _recorder(acks: dict[int, KafkaError | None], row_id: int) -> Callable[[Any, Any], None]:
    def on_delivery(err: Any, _msg: Any) -> None:
        acks[row_id] = err

    return on_delivery


def lock_key(table: str) -> int:
    """A stable advisory-lock key per outbox table (advisory locks are per database)."""
    return 0x0B0C << 32 | zlib.crc32(f"flashsend-relay:{table}".encode())


def is_transient(code: int | None) -> bool:
    return code is None or code in _TRANSIENT_CODES


@dataclass(frozen=True)
class RelayConfig:
    table: str  # "outbox" (order service) or "mail_outbox" (mail service)
    bootstrap: str
    registry_url: str
    registry_auto_register: bool = False  # only on the local stack (schemas.serde.schema_id)
    schema_compatibility: str = "FULL"
    notify_channel: str | None = None  # LISTEN for a doorbell; the relay polls anyway
    batch: int = 100
    poll_s: float = 0.5
    publish_timeout_s: float = 30.0
    max_failures: int = 10
    backoff_base_s: float = 0.2
    backoff_cap_s: float = 30.0


@dataclass
class PassResult:
    published: int = 0
    failed_id: int | None = None
    transient: bool = False
    dead: bool = False


@dataclass
class RelayStats:
    published: int = 0
    failures: int = 0
    dead: int = 0
    passes: int = 0
    lock_held: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class NotLeader(Exception):
    """Another relay holds the advisory lock."""


class OutboxRelay:
    def __init__(self, dsn: str, config: RelayConfig, *, rng: random.Random | None = None) -> None:
        self.dsn = dsn
        self.config = config
        self.rng = rng or random.Random()
        self.stats = RelayStats()
        self._conn: psycopg.Connection[Any] | None = None
        self._pid: int | None = None
        self._codecs: dict[str, AvroCodec] = {}
        self._producer = Producer(
            {
                "bootstrap.servers": config.bootstrap,
                "enable.idempotence": True,  # broker-side retries never duplicate or reorder
                "acks": "all",
                "linger.ms": 1,
                "message.timeout.ms": int(config.publish_timeout_s * 1000),
                "socket.connection.setup.timeout.ms": 5000,
            }
        )
        ident = sql.Identifier(config.table)
        self._sql = {
            name: sql.SQL(query(name)).format(outbox=ident)  # type: ignore[arg-type,unused-ignore]
            for name in (
                "outbox_next_batch",
                "outbox_mark_published",
                "outbox_record_failure",
                "outbox_record_transient",
                "outbox_health",
            )
        }

    # ---- leadership -----------------------------------------------------------------------

    def acquire(self) -> bool:
        """Try to become the one active relay of this outbox. Non-blocking."""
        if self._conn is not None and not self._conn.closed and self.stats.lock_held:
            return True
        self.close_connection()
        conn = psycopg.connect(self.dsn, autocommit=True)
        row = conn.execute(
            "SELECT pg_try_advisory_lock(%s), pg_backend_pid()", (lock_key(self.config.table),)
        ).fetchone()
        if not row or not row[0]:
            conn.close()
            return False
        if self.config.notify_channel:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.config.notify_channel)))
        self._conn, self._pid = conn, int(row[1])
        self.stats.lock_held = True
        log.info("relay %s: advisory lock acquired (pid %s)", self.config.table, self._pid)
        return True

    def close_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()  # the advisory lock goes with the session
            finally:
                self._conn = None
                self.stats.lock_held = False

    def close(self) -> None:
        self.close_connection()
        self._producer.flush(5)

    def _session(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is None or conn.closed:
            self.stats.lock_held = False
            raise NotLeader("relay connection lost")
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        if row is None or int(row[0]) != self._pid:
            # A pooler handed us another server session: the lock is not ours any more.
            self.close_connection()
            raise NotLeader("backend pid changed: is a transaction-mode pooler in the way?")
        return conn

    # ---- one pass -------------------------------------------------------------------------

    def run_once(self) -> PassResult:
        """Publish one batch. Requires the lock (acquire() first)."""
        conn = self._session()
        rows = conn.execute(self._sql["outbox_next_batch"], {"limit": self.config.batch}).fetchall()
        self.stats.passes += 1
        result = PassResult()
        if not rows:
            return result
        acks: dict[int, KafkaError | None] = {}
        produced: list[int] = []
        failure: tuple[int, str, bool] | None = None  # (id, error, transient)
        for row in rows:
            row_id = int(row[0])
            try:
                value, headers = self._encode(row)
            except FlashsendError as exc:  # the registry, not the row: wait, spend no budget
                failure = (row_id, f"encode: {exc}", True)
                break
            except Exception as exc:  # fastavro raises many types for a payload off-schema
                failure = (row_id, f"encode: {type(exc).__name__}: {exc}", False)
                break
            try:
                self._producer.produce(
                    row[2],
                    key=str(row[3]).encode(),
                    value=value,
                    headers=headers,
                    on_delivery=_recorder(acks, row_id),
                )
            except (KafkaException, BufferError) as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                code = err.code() if err is not None else None
                failure = (
                    row_id,
                    f"produce: {exc}",
                    isinstance(exc, BufferError) or (code is not None and is_transient(code)),
                )
                break
            produced.append(row_id)
        self._producer.flush(self.config.publish_timeout_s + 5)
        for row_id in produced:
            err = acks.get(row_id)
            if row_id in acks and err is None:
                conn.execute(self._sql["outbox_mark_published"], {"id": row_id})
                result.published += 1
            elif failure is None or row_id < failure[0]:
                code = err.code() if err is not None else None
                failure = (row_id, f"ack: {err or 'no ack'}", is_transient(code))
        metrics.count_published(self.config.table, result.published)
        self.stats.published += result.published
        if failure is not None:
            self._record_failure(conn, failure, result)
        return result

    def _record_failure(
        self, conn: psycopg.Connection[Any], failure: tuple[int, str, bool], result: PassResult
    ) -> None:
        row_id, error, transient = failure
        result.failed_id, result.transient = row_id, transient
        self.stats.failures += 1
        if transient:
            conn.execute(self._sql["outbox_record_transient"], {"id": row_id, "error": error})
            log.warning(
                "relay %s: row %s not published (transient): %s", self.config.table, row_id, error
            )
            return
        row = conn.execute(
            self._sql["outbox_record_failure"],
            {"id": row_id, "error": error, "max_failures": self.config.max_failures},
        ).fetchone()
        attempts, dead = (int(row[0]), bool(row[1])) if row else (0, False)
        result.dead = dead
        if dead:
            self.stats.dead += 1
            log.error(
                "ALERT outbox row dead: table=%s id=%s attempts=%d error=%s "
                "(skipped; later events continue — replay it by clearing dead_at)",
                self.config.table,
                row_id,
                attempts,
                error,
            )
        else:
            log.warning(
                "relay %s: row %s failed (%d/%d): %s",
                self.config.table,
                row_id,
                attempts,
                self.config.max_failures,
                error,
            )

    def _encode(self, row: tuple[Any, ...]) -> tuple[bytes, list[tuple[str, str | bytes | None]]]:
        (
            _id,
            event_id,
            _topic,
            _key,
            schema_name,
            event_type,
            version,
            dedupe_key,
            payload,
            occurred_at,
            _attempts,
        ) = row
        codec = self._codecs.get(schema_name)
        if codec is None:
            codec = AvroCodec(
                registry_client(self.config.registry_url),
                schema_name,
                auto_register=self.config.registry_auto_register,
                compatibility=self.config.schema_compatibility,
            )
            self._codecs[schema_name] = codec
        record = {
            **payload,
            "event_id": str(event_id),
            "event_type": event_type,
            "version": int(version),
            "occurred_at": int(occurred_at.timestamp() * 1000),
            "dedupe_key": dedupe_key,
        }
        headers: list[tuple[str, str | bytes | None]] = [
            ("flashsend.schema", schema_name.encode()),
            ("event_type", str(event_type).encode()),
            ("event_id", str(event_id).encode()),
        ]
        return codec.encode(record), headers

    def health(self) -> dict[str, Any]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(self._sql["outbox_health"]).fetchone()
        backlog, lag, dead = row if row else (0, None, 0)
        return {"backlog": int(backlog), "lag_s": float(lag or 0.0), "dead": int(dead)}

    # ---- the loop -------------------------------------------------------------------------

    def run(
        self,
        stop: threading.Event,
        on_pass: Callable[[PassResult], None] | None = None,
        on_loop: Callable[[], None] | None = None,
    ) -> None:
        """Until `stop`: hold the lock (or wait for it), publish, back off on errors. Never
        dies on an error: a relay thread that silently stopped would stall every event.
        `on_loop` is called at the top of every turn (a liveness heartbeat)."""
        failures = 0
        while not stop.is_set():
            if on_loop is not None:
                on_loop()
            try:
                if not self.acquire():
                    stop.wait(max(self.config.poll_s, 1.0))  # standby: another relay leads
                    continue
                result = self.run_once()
                if on_pass is not None:
                    on_pass(result)
                if result.failed_id is not None and not result.dead:
                    failures += 1
                    stop.wait(self._backoff(failures))
                elif result.published == 0 and result.failed_id is None:
                    failures = 0
                    self._wait_for_doorbell(stop)
                else:
                    failures = 0
            except (psycopg.Error, NotLeader) as exc:
                log.warning("relay %s: database session lost: %s", self.config.table, exc)
                self.close_connection()
                failures += 1
                stop.wait(self._backoff(failures))
            except Exception:
                log.exception("relay %s: unexpected error; retrying", self.config.table)
                self.close_connection()
                failures += 1
                stop.wait(self._backoff(failures))
        self.close()

    def _backoff(self, failures: int) -> float:
        return max(
            0.05,
            backoff_delay(
                min(failures, 20),
                base=self.config.backoff_base_s,
                cap=self.config.backoff_cap_s,
                rng=self.rng,
            ),
        )

    def _wait_for_doorbell(self, stop: threading.Event) -> None:
        conn = self._conn
        if conn is None or not self.config.notify_channel:
            stop.wait(self.config.poll_s)
            return
        deadline = time.monotonic() + self.config.poll_s
        for _ in conn.notifies(timeout=max(0.0, deadline - time.monotonic()), stop_after=1):
            pass
