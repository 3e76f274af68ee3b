"""Running the feedback loop's pieces for the e2e command, the benchmark and the tests.

A scratch database and topic set on the current stack, a real `flashsend webhook` process, the
feedback group's lag, and the SQL the checks need. Nothing here is a fake: the processes are
the ones `flashsend up` and `flashsend worker --role feedback` run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil
import psycopg
from confluent_kafka import Consumer, KafkaException, TopicPartition

from flashsend import deliverability
from flashsend.settings import Settings, settings_env
from infra.migrate import apply_migrations
from infra.postgres import PostgresServer
from infra.process import free_port, terminate

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T | None], timeout: float, every: float = 0.1) -> T:
    """Poll `check` until it returns something truthy; TimeoutError names `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(every)


def scratch_settings(settings: Settings, label: str) -> Settings:
    """A fresh migrated database, topics, groups and configuration set on the same stack."""
    suffix = f"{label}{uuid.uuid4().hex[:8]}"
    database = f"fb_{suffix}"
    PostgresServer(settings).create_database(database)
    dsn = settings.pg_dsn_for(database)
    apply_migrations(dsn)
    # Campaign ids are SES tags, and the stand-in outlives this database: start elsewhere.
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = random.randrange(10**9, 2 * 10**9)
        conn.execute(f"ALTER SEQUENCE campaigns_id_seq RESTART WITH {start}")
    return settings.model_copy(
        update={
            "pg_database": database,
            "pg_dsn": dsn,
            "topic_recipients": f"recipients-{suffix}",
            "topic_mail_events": f"mail-events-{suffix}",
            "topic_dlq": f"dlq-{suffix}",
            "group_sender": f"sender-{suffix}",
            "app_id": f"flashsend-{suffix}",
        }
    )


def in_scratch(settings: Settings, label: str, log: Callable[[str], None]) -> tuple[Settings, Path]:
    """A scratch database for a run on the running stack (kept for inspection: the run's
    result names it) and the directory for the run's process logs."""
    scratch = scratch_settings(settings, label)
    log(f"scratch database {scratch.pg_database}")
    return scratch, settings.state_dir / f"feedback-{label}"


def with_feedback(settings: Settings, **overrides: Any) -> Settings:
    """Own webhook port, SNS topic and marketing configuration set (the stand-in is shared:
    its subscriptions and feedback rates are scoped by configuration set)."""
    suffix = uuid.uuid4().hex[:8]
    values: dict[str, Any] = {
        "webhook_port": free_port(),
        "webhook_public_url": "",
        "marketing_configuration_set": f"marketing-{suffix}",
        "sns_topic_arns": (f"arn:aws:sns:us-east-1:000000000000:flashsend-events-{suffix}",),
    }
    values.update(overrides)
    return settings.model_copy(update=values)


@dataclass
class WebhookProcess:
    """A real `flashsend webhook` process with these settings."""

    settings: Settings
    proc: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(cls, settings: Settings, log_dir: Path, timeout: float = 60.0) -> WebhookProcess:
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"webhook-{settings.webhook_port}.log"
        env = {
            **os.environ,
            **settings_env(settings),
            "PYTHONUNBUFFERED": "1",
            "FLASHSEND_WORKER_EXIT_WITH_PARENT": "true",
        }
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "flashsend.cli", "webhook", "--loglevel", "info"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        webhook = cls(settings, proc, log_path)
        processes = deliverability.webhook_processes(settings)
        try:
            wait_for("webhook health", webhook.healthy, timeout, every=0.05)
            # Health answers once one process listens; the others may still be importing.
            wait_for(
                f"all {processes} webhook processes listening",
                lambda: len(webhook.answering_pids(processes)) >= processes,
                timeout,
                every=0.2,
            )
        except TimeoutError:
            webhook.stop()
            raise
        return webhook

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.webhook_port}"

    @property
    def sns_url(self) -> str:
        return self.url + deliverability.SNS_PATH

    @property
    def firehose_url(self) -> str:
        return self.url + deliverability.FIREHOSE_PATH

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"webhook exited; see {self.log_path}")
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                return bool(json.loads(response.read()).get("ok"))
        except OSError:
            return False

    def stats(self) -> dict[str, Any]:
        """The /stats of whichever process answers this new connection."""
        with urllib.request.urlopen(self.url + "/stats", timeout=5) as response:
            return dict(json.loads(response.read()))

    def answering_pids(self, want: int, tries: int = 300) -> set[int]:
        """The processes that answer up to `tries` new connections, stopping at `want` (the
        kernel spreads connections over SO_REUSEPORT listeners by a hash of their ports)."""
        seen: set[int] = set()
        for _ in range(tries):
            seen.add(int(self.stats()["pid"]))
            if len(seen) >= want:
                break
        return seen

    def stop(self) -> None:
        if self.proc.poll() is None:
            terminate(self.proc.pid, timeout=15)
        self.proc.wait(timeout=10)


def end_offsets(settings: Settings, topic: str) -> dict[int, int]:
    consumer = Consumer(
        {"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"}
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return {}
        out = {}
        for p in meta.partitions:
            for attempt in range(50):  # a new topic's leader may not be elected yet
                try:
                    _low, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, p), timeout=10
                    )
                    break
                except KafkaException:
                    if attempt == 49:
                        raise
                    time.sleep(0.1)
            out[p] = int(high)
        return out
    finally:
        consumer.close()


def feedback_lag(settings: Settings) -> int:
    """Records of mail.events the feedback group has not applied yet (offsets in PostgreSQL)."""
    ends = end_offsets(settings, settings.topic_mail_events)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT partition, next_offset FROM kafka_offsets WHERE group_id = %s AND topic = %s",
            (deliverability.feedback_app_id(settings), settings.topic_mail_events),
        ).fetchall()
    stored: dict[int, int] = {int(p): int(o) for p, o in rows}
    return sum(max(0, end - stored.get(p, 0)) for p, end in ends.items())


def insert_users(settings: Settings, count: int, domain: str, first_id: int = 1) -> None:
    """`count` active, opted-in users `u<id>@<domain>` (one statement)."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO users (id, email, status, marketing_opt_in, first_name) "
            "SELECT g, 'u' || g || '@' || %s, 'active', true, 'Lan' "
            "FROM generate_series(%s::bigint, %s::bigint) g",
            (domain, first_id, first_id + count - 1),
        )
        conn.execute("ANALYZE users")


def suppressed(settings: Settings) -> dict[str, str]:
    """Addresses suppressed by the feedback loop (not by seeding), with their reason."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT email, reason FROM email_suppressions WHERE source_event <> 'seed'"
        ).fetchall()
    return {str(e): str(r) for e, r in rows}


def campaign_row(settings: Settings, campaign_id: int) -> dict[str, Any]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status, reason, paused_at, recipients FROM campaigns WHERE id = %s",
            (campaign_id,),
        ).fetchone()
        counts: dict[str, int] = {
            str(k): int(v)
            for k, v in conn.execute(
                "SELECT status, count(*) FROM campaign_recipients WHERE campaign_id = %s "
                "GROUP BY status",
                (campaign_id,),
            ).fetchall()
        }
    assert row is not None
    return {
        "status": row[0],
        "reason": row[1],
        "paused_at": row[2],
        "recipients": row[3],
        "counts": counts,
    }


def feedback_counters(settings: Settings, campaign_id: int) -> dict[str, Any]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT sent, delivered, bounced, soft_bounced, complained, unsubscribed, "
            "auto_paused_at, auto_pause_reason FROM campaign_feedback WHERE campaign_id = %s",
            (campaign_id,),
        )
        row = cur.fetchone()
        names = [d.name for d in cur.description or []]
    return {} if row is None else dict(zip(names, row, strict=True))


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its live descendants."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system
    except psutil.Error:
        pass
    return total


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot (/proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(v) for v in fields]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")
