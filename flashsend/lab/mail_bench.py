"""`flashsend mail bench`: order commit → SES accepted latency while a flash-sale campaign runs.

Everything is real and runs side by side on this machine: campaign workers sending at the
campaign rate, one mail worker (`flashsend worker --role mail`), the order-service relay,
and orders placed at a steady rate. The SES account's MaxSendRate is set (stand-in only) to
campaign rate + the transactional reserve + a margin, as in production, so the test is the
real one: does the campaign leave the transactional share free? The latency is measured at
the provider: the stand-in's acceptance time of each confirmation minus the order's commit
time (same clock, same machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

from flashsend.errors import FlashsendError
from flashsend.settings import Settings, settings_env
from infra.process import terminate


@dataclass(frozen=True)
class BenchOptions:
    orders: int = 300
    order_rate: float = 10.0
    campaign_rate: float = 600.0
    users: int = 40_000
    campaign_workers: int = 1
    timeout_s: float = 180.0
    ramp_timeout_s: float = 60.0  # then measure anyway, at the rate the campaign reached


def spawn_worker(settings: Settings, role: str, log_dir: Path) -> subprocess.Popen[bytes]:
    """A real `flashsend worker --role ROLE` process with these settings."""
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **settings_env(settings), "PYTHONUNBUFFERED": "1"}
    with open(log_dir / f"{role}-worker.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "flashsend.cli", "worker", "--role", role, "--loglevel", "info"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def run_bench(
    settings: Settings, options: BenchOptions, log: Callable[[str], None] = print
) -> dict[str, Any]:
    from flashsend.lab.demo import ensure_users
    from flashsend.lab.workers import WorkerPool
    from infra.orders_db import ensure_orders_db
    from infra.ses_standin.admin import SesStandinAdmin
    from producers.campaign_ops import (
        DEFAULT_HTML,
        DEFAULT_SUBJECT,
        DEFAULT_TEMPLATE,
        DEFAULT_TEXT,
        create_campaign,
    )
    from producers.mail_topics import ensure_mail_topics
    from producers.outbox_relay import OutboxRelay
    from sinks.ses import SesSender, make_client
    from streams.mail_app import ensure_templates, relay_config

    if not settings.ses_endpoint_url:
        raise FlashsendError("the bench measures at the SES stand-in: it needs a local endpoint")
    admin = SesStandinAdmin(settings.ses_endpoint_url)
    orders_dsn = ensure_orders_db(settings)
    ensure_mail_topics(settings)
    ses = SesSender(make_client(settings, timeout=10))
    ses.put_template(DEFAULT_TEMPLATE, DEFAULT_SUBJECT, DEFAULT_HTML, DEFAULT_TEXT)
    ensure_templates(ses)
    seeded = ensure_users(settings, options.users)
    log(f"users ready ({seeded:.1f}s seeding)")
    account_rate = options.campaign_rate + settings.transactional_reserve + 50
    previous = admin.faults()["max_send_rate"]
    admin.set_faults(max_send_rate=account_rate)
    log_dir = settings.state_dir / "logs" / f"bench-{int(time.time())}"
    pool = WorkerPool(settings, log_dir)
    mail_worker = spawn_worker(settings, "mail", log_dir)
    relay = OutboxRelay(orders_dsn, relay_config(settings, "outbox", "outbox"))
    stop_relay = threading.Event()
    relay_thread = threading.Thread(target=relay.run, args=(stop_relay,), daemon=True)
    relay_thread.start()
    campaign_id: int | None = None
    run = uuid.uuid4().hex[:8]
    try:
        pool.start(options.campaign_workers)
        warm = _place(orders_dsn, settings, f"bench-{run}-warmup@shop.flashsend.test")
        _wait_sent(settings, [warm], mail_worker, timeout=90)
        log("mail worker ready")
        campaign_id = create_campaign(settings, name=f"bench-{run}", rate=options.campaign_rate)
        starter = threading.Thread(
            target=_start_campaign, args=(settings, campaign_id), daemon=True
        )
        starter.start()
        ramp_s, reached = _wait_campaign_running(admin, campaign_id, options, pool)
        log(
            f"campaign {campaign_id} at {options.campaign_rate:g}/s after {ramp_s:.1f}s; "
            "placing orders"
        )
        began = time.time()
        placed: list[tuple[int, str, float]] = []
        interval = 1.0 / options.order_rate
        for i in range(options.orders):
            target = began + i * interval
            time.sleep(max(0.0, target - time.time()))
            to = f"bench-{run}-{i}@shop.flashsend.test"
            placed.append((_place(orders_dsn, settings, to), to, time.time()))
        ended = time.time()
        _wait_sent(settings, [p[0] for p in placed], mail_worker, timeout=options.timeout_s)
        latencies: list[float] = []
        for _order_id, to, committed in placed:
            msgs = admin.messages(destination=to, limit=5)
            if len(msgs) != 1:
                raise FlashsendError(f"{to}: {len(msgs)} messages at the provider, expected 1")
            latencies.append((float(msgs[0]["time"]) - committed) * 1000.0)
        window = [
            n
            for t, n in admin.rate(campaign=str(campaign_id), bucket_ms=1000)
            if began <= t < ended - 1
        ]
        attempts = _max_attempts(settings, [p[0] for p in placed])
        return {
            "orders": len(placed),
            "order_rate": options.order_rate,
            "latency_ms": {
                "median": round(percentile(latencies, 50), 1),
                "p90": round(percentile(latencies, 90), 1),
                "p99": round(percentile(latencies, 99), 1),
                "max": round(max(latencies), 1),
            },
            "campaign_id": campaign_id,
            "campaign_rate_limit": options.campaign_rate,
            "campaign_sent_per_s_during_orders": round(sum(window) / len(window), 1)
            if window
            else 0.0,
            "campaign_min_per_s_during_orders": min(window) if window else 0,
            "account_max_send_rate": account_rate,
            "mail_attempts_max": attempts,
            "campaign_workers": options.campaign_workers,
            "campaign_ramp_s": round(ramp_s, 1),
            "campaign_reached_rate_before_orders": reached,
            "logs": str(log_dir),
        }
    finally:
        if campaign_id is not None:
            _cancel_campaign(settings, campaign_id)
        stop_relay.set()
        relay_thread.join(10)
        terminate(mail_worker.pid, timeout=20)
        mail_worker.wait(timeout=10)
        pool.stop()
        admin.set_faults(max_send_rate=previous)


def _place(orders_dsn: str, settings: Settings, to: str) -> int:
    from sinks.order_store import NewOrder, place_order

    with psycopg.connect(orders_dsn) as conn, conn.transaction():
        order = NewOrder(email=to, customer_name="Bench", total=Decimal("100000"))
        return place_order(conn, order, topic=settings.topic_order_events).order_id


def _start_campaign(settings: Settings, campaign_id: int) -> None:
    from producers.campaign import start_campaign

    start_campaign(settings, campaign_id)


def _wait_sent(
    settings: Settings, order_ids: list[int], worker: subprocess.Popen[bytes], timeout: float
) -> None:
    keys = [f"order-confirmed:{i}" for i in order_ids]
    deadline = time.monotonic() + timeout
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM mail WHERE dedupe_key = ANY(%s) AND status = 'sent'",
                (keys,),
            ).fetchone()
            if row is not None and int(row[0]) == len(keys):
                return
            if worker.poll() is not None:
                raise FlashsendError("the mail worker exited; see its log")
            if time.monotonic() > deadline:
                raise FlashsendError(f"{len(keys) - int(row[0] if row else 0)} mails not sent")
            time.sleep(0.1)


def _wait_campaign_running(
    admin: Any, campaign_id: int, options: BenchOptions, pool: Any
) -> tuple[float, bool]:
    """Until the campaign sends at ~its rate at the provider (two full seconds at >= 85 %),
    at most ramp_timeout_s: measuring during its ramp-up would flatter the result. Returns
    the seconds waited and whether the rate was reached (the report shows the real rate)."""
    began = time.monotonic()
    while True:
        now = time.time()
        full = [
            n for t, n in admin.rate(campaign=str(campaign_id), bucket_ms=1000) if t + 1.0 <= now
        ]
        if len(full) >= 2 and min(full[-2:]) >= 0.85 * options.campaign_rate:
            return time.monotonic() - began, True
        if not pool.alive():
            raise FlashsendError("campaign workers exited; see their logs")
        if time.monotonic() - began > options.ramp_timeout_s:
            if not full or full[-1] == 0:
                raise FlashsendError("the campaign is not sending")
            return time.monotonic() - began, False
        time.sleep(0.25)


def _max_attempts(settings: Settings, order_ids: list[int]) -> int:
    keys = [f"order-confirmed:{i}" for i in order_ids]
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute(
            "SELECT coalesce(max(attempts), 0) FROM mail WHERE dedupe_key = ANY(%s)", (keys,)
        ).fetchone()
    return int(row[0]) if row else 0


def _cancel_campaign(settings: Settings, campaign_id: int) -> None:
    from sinks.campaign_store import CampaignStore

    try:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            CampaignStore(conn).transition(campaign_id, "cancelled", "bench finished")
    except FlashsendError:
        pass  # already finished
