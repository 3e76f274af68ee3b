"""Scrape-time gauges (flashsend.metrics.StateCollector readers): the I/O side of metrics.

Each reader opens one short autocommit connection per (cached) scrape and asks the broker for
log-end offsets with one long-lived consumer (no group join, nothing committed).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from prometheus_client.core import GaugeMetricFamily
from psycopg import sql

from flashsend import deliverability, health, metrics
from flashsend.scaling import LAG_METRIC
from flashsend.settings import Settings
from sinks.queries import query

Reader = Callable[[], list[GaugeMetricFamily]]


class Watermarks:
    """Log-end offsets, through one consumer that never joins a group."""

    def __init__(self, bootstrap: str) -> None:
        self._bootstrap = bootstrap
        self._consumer: Consumer | None = None
        self._lock = threading.Lock()

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(
                {
                    "bootstrap.servers": self._bootstrap,
                    "group.id": f"flashsend-metrics-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                }
            )
        return self._consumer

    def check_brokers(self, timeout: float = 2.0) -> None:
        """Raises unless a broker answers a metadata request within `timeout` (readiness)."""
        with self._lock:
            brokers = self._client().list_topics(timeout=timeout).brokers
        if not brokers:
            raise ConnectionError("no Kafka broker answered")

    def ends(self, topic: str) -> dict[int, tuple[int, int]]:
        with self._lock:
            consumer = self._client()
            md = consumer.list_topics(topic, timeout=3).topics.get(topic)
            if md is None or md.error is not None:
                return {}
            out = {}
            for p in md.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=3)
                out[p] = (int(low), int(high))
            return out


def lag_reader(dsn: str, marks: Watermarks, group_id: str, topic: str) -> Reader:
    def read() -> list[GaugeMetricFamily]:
        lag = GaugeMetricFamily(
            LAG_METRIC,
            "records not yet processed: log end - offset stored in "
            "PostgreSQL (what the workers resume from)",
            labels=["group", "topic", "partition"],
        )
        end = GaugeMetricFamily(
            "flashsend_log_end_offset", "log end offset", labels=["topic", "partition"]
        )
        with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
            stored = {
                int(p): int(o)
                for p, o in conn.execute(
                    query("metrics_offsets"), {"group_id": group_id, "topic": topic}
                )
            }
        for p, (low, high) in sorted(marks.ends(topic).items()):
            lag.add_metric([group_id, topic, str(p)], max(0, high - max(stored.get(p, 0), low)))
            end.add_metric([topic, str(p)], high)
        return [lag, end]

    return read


def outbox_reader(dsn: str, table: str) -> Reader:
    statement = sql.SQL(query("outbox_health")).format(outbox=sql.Identifier(table))  # type: ignore[arg-type,unused-ignore]

    def read() -> list[GaugeMetricFamily]:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
            row = conn.execute(statement).fetchone()
        backlog, lag_s, dead = row if row else (0, None, 0)
        families = []
        for name, doc, value in (
            ("flashsend_outbox_backlog", "unpublished outbox rows", backlog),
            (
                "flashsend_outbox_oldest_age_seconds",
                "age of the oldest unpublished row",
                float(lag_s or 0.0),
            ),
            ("flashsend_outbox_dead", "outbox rows given up (dead_at set)", dead),
        ):
            g = GaugeMetricFamily(name, doc, labels=["table"])
            g.add_metric([table], float(value or 0))
            families.append(g)
        return families

    return read


def dlq_reader(marks: Watermarks, topic: str) -> Reader:
    def read() -> list[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            "flashsend_dlq_messages", "records in the dead-letter topic", labels=["topic"]
        )
        g.add_metric([topic], sum(high - low for low, high in marks.ends(topic).values()))
        return [g]

    return read


def feedback_reader(dsn: str) -> Reader:
    """Complaint and bounce rates per campaign from campaign_feedback (if present)."""

    def read() -> list[GaugeMetricFamily]:
        complaint = GaugeMetricFamily(
            "flashsend_complaint_rate",
            "complaints / sent (SES events) per campaign",
            labels=["campaign"],
        )
        bounce = GaugeMetricFamily(
            "flashsend_bounce_rate", "hard bounces / sent per campaign", labels=["campaign"]
        )
        with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
            exists = conn.execute("SELECT to_regclass('campaign_feedback')").fetchone()
            rows: list[Any] = []
            if exists and exists[0]:
                rows = conn.execute(query("metrics_campaign_feedback")).fetchall()
        for cid, sent, complained, bounced in rows:
            if sent:
                complaint.add_metric([str(cid)], complained / sent)
                bounce.add_metric([str(cid)], bounced / sent)
        return [complaint, bounce]

    return read


def campaign_counts_reader(dsn: str) -> Reader:
    """Recipients per status of live campaigns (the `unknown` alert reads it)."""

    def read() -> list[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            "flashsend_campaign_recipients",
            "recipients of a live or recently finished campaign, by status",
            labels=["campaign", "status"],
        )
        with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
            rows = conn.execute(query("metrics_campaign_counts")).fetchall()
        for cid, status, n in rows:
            g.add_metric([str(cid), str(status)], float(n))
        return [g]

    return read


def combine(*readers: Reader) -> Reader:
    def read() -> list[GaugeMetricFamily]:
        out: list[GaugeMetricFamily] = []
        for r in readers:
            try:
                out += r()
            except Exception as exc:  # one broken source must not blank the others
                metrics.log.warning("metrics source failed: %s", exc)
        return out

    return read


ROLES = ("campaign", "mail", "feedback", "relay", "webhook")


def readers_for(settings: Settings, role: str, marks: Watermarks) -> list[Reader]:
    """The scrape-time gauges of a process role: its consumer lag per partition, its outbox,
    the dead-letter topic, and the campaign rates and counts it can see."""
    s = settings
    if role == "campaign":
        return [
            lag_reader(s.pg_dsn, marks, s.group_sender, s.topic_recipients),
            dlq_reader(marks, s.topic_dlq),
            feedback_reader(s.pg_dsn),
            campaign_counts_reader(s.pg_dsn),
        ]
    if role == "mail":
        return [
            lag_reader(s.pg_dsn, marks, s.group_mail, s.topic_order_events),
            outbox_reader(s.pg_dsn, "mail_outbox"),
            dlq_reader(marks, s.topic_dlq),
        ]
    if role == "feedback":
        return [
            lag_reader(s.pg_dsn, marks, deliverability.feedback_app_id(s), s.topic_mail_events),
            dlq_reader(marks, s.topic_dlq),
            feedback_reader(s.pg_dsn),
        ]
    if role == "relay":
        return [outbox_reader(s.orders_pg_dsn, "outbox")]
    if role == "webhook":
        return [feedback_reader(s.pg_dsn), outbox_reader(s.pg_dsn, "feedback_outbox")]
    raise ValueError(f"unknown metrics role {role}; one of {ROLES}")


def declare(settings: Settings, role: str) -> None:
    """The role's counters at 0 from the start (flashsend.metrics.declare)."""
    s = settings
    if role == "campaign":
        metrics.declare(
            ses_calls=[("SendBulkEmail", "ok")],
            throttle_paths=["campaign"],
            ingested_topics=[s.topic_recipients],
        )
    elif role == "mail":
        metrics.declare(
            ses_calls=[("SendEmail", status) for status in ("sent", "retry", "failed", "unknown")],
            throttle_paths=["mail"],
            mail_statuses=["sent", "retry", "failed", "unknown", "suppressed"],
            ingested_topics=[s.topic_order_events],
            published_tables=["mail_outbox"],
        )
    elif role == "feedback":
        metrics.declare(suppression_reasons=["feedback"], ingested_topics=[s.topic_mail_events])
    elif role == "relay":
        metrics.declare(published_tables=["outbox"])
    elif role == "webhook":
        metrics.declare(
            webhook_outcomes=["accepted", "rejected", "bad_request", "error"],
            published_tables=["feedback_outbox"],
        )


def pg_check(dsn: str, timeout_s: int = 2) -> Callable[[], None]:
    def check() -> None:
        with psycopg.connect(dsn, connect_timeout=timeout_s, autocommit=True) as conn:
            conn.execute("SELECT 1")

    return check


def probe_stores(settings: Settings, role: str, marks: Watermarks) -> None:
    """What /readyz asks for this role (flashsend.health): its databases and the brokers."""
    s = settings
    probe = health.PROBE
    probe.store("kafka", marks.check_brokers)
    if role in ("campaign", "mail", "feedback", "webhook"):
        probe.store("postgresql", pg_check(s.pg_dsn))
    if role == "relay":
        probe.store("orders database", pg_check(s.orders_pg_dsn))


def start(settings: Settings, role: str) -> int | None:
    """Serve /metrics for a process role (campaign | mail | feedback | relay | webhook), if
    enabled."""
    s = settings
    if s.metrics_port == 0:
        return None
    marks = Watermarks(s.kafka_bootstrap)
    readers = readers_for(s, role, marks)
    declare(s, role)
    probe_stores(s, role, marks)
    try:
        metrics.install("state", metrics.StateCollector(combine(*readers)))
        return metrics.serve(s.metrics_port, s.metrics_host)
    except Exception as exc:  # e.g. the port is taken: keep working, say so loudly
        metrics.log.error("ALERT metrics not served on port %s: %s", s.metrics_port, exc)
        return None
