"""`flashsend demo`: seed users, create and start a campaign, run W real workers, show
progress, and summarise with figures from our tables AND from the SES stand-in (duplicates
and the busiest sliding second are measured at the provider, not trusted from our own rows)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg

from flashsend.commands.campaign import (
    DEFAULT_HTML,
    DEFAULT_SUBJECT,
    DEFAULT_TEMPLATE,
    DEFAULT_TEXT,
    create_campaign,
)
from flashsend.errors import FlashsendError
from flashsend.progress import ProgressLine
from flashsend.settings import Settings
from flashsend.workers import WorkerPool
from producers.campaign import start_campaign
from sinks.campaign_store import SETTLED, CampaignStore
from sinks.ses import SesSender, make_client
from sinks.users import seed_users

# The progress query scans the campaign's rows (no status index, by design): polling it
# every half second measurably slows a 1M-row campaign, so watch at a gentler pace.
PROGRESS_POLL_S = 2.0


@dataclass(frozen=True)
class DemoOptions:
    users: int = 1_000_000
    rate: float = 0.0
    workers: int = 2
    timeout_s: float = 1800.0
    show_progress: bool = True


def ensure_users(settings: Settings, wanted: int) -> float:
    """Top the users table up to `wanted` rows; returns seconds spent seeding."""
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM users").fetchone()
    have = int(row[0]) if row else 0
    if have >= wanted:
        return 0.0
    began = time.monotonic()
    seed_users(settings.pg_dsn, wanted - have)
    return time.monotonic() - began


def standin_stats(settings: Settings, campaign_id: int) -> dict[str, Any]:
    if not settings.ses_endpoint_url:
        return {}
    from infra.ses_standin.admin import SesStandinAdmin

    return dict(SesStandinAdmin(settings.ses_endpoint_url).stats(campaign=str(campaign_id)))


def run_demo(settings: Settings, options: DemoOptions, log: Any = print) -> dict[str, Any]:
    log(
        f"demo: {options.users:,} users, rate {options.rate or 'unlimited'}, "
        f"{options.workers} worker(s), {settings.partitions} partitions"
    )
    seed_s = ensure_users(settings, options.users)
    if seed_s:
        log(f"seeded users in {seed_s:.1f}s")
    SesSender(make_client(settings, timeout=10)).put_template(
        DEFAULT_TEMPLATE, DEFAULT_SUBJECT, DEFAULT_HTML, DEFAULT_TEXT
    )
    # The audience is the first N users, so --users means the same on a bigger database.
    audience = f"({settings.audience_condition}) AND u.id <= {int(options.users)}"
    campaign_id = create_campaign(
        settings, name=f"demo-{int(time.time())}", rate=options.rate, audience=audience
    )
    pool = WorkerPool(settings, settings.state_dir / "logs")
    pool.start(options.workers)
    began = time.monotonic()
    try:
        bar = ProgressLine(f"campaign {campaign_id} produce") if options.show_progress else None
        started = start_campaign(
            settings, campaign_id, progress=(lambda d, t: bar.update(d, t)) if bar else None
        )
        if bar:
            bar.close()
        log(
            f"snapshot {started.recipients:,} recipients in {started.snapshot_s:.1f}s, "
            f"produced {started.produced:,} in {started.produce_s:.1f}s"
        )
        progress = wait_until_finished(settings, campaign_id, pool, options, began)
    finally:
        pool.stop()
    elapsed = time.monotonic() - began
    stats = standin_stats(settings, campaign_id)
    summary = {
        "campaign_id": campaign_id,
        "recipients": progress.total,
        "sent": progress["sent"],
        "failed": progress["failed"],
        "skipped": progress["skipped"],
        "unknown": progress["unknown"],
        "pending": progress["pending"],
        "sending": progress["sending"],
        "cancelled": progress["cancelled"],
        "duplicates": stats.get("duplicates"),
        "accepted_by_ses": stats.get("accepted"),
        "elapsed_s": round(elapsed, 2),
        "snapshot_s": round(started.snapshot_s, 2),
        "produce_s": round(started.produce_s, 2),
        "send_rate_per_s": round(progress.send_rate, 1),
        "rate_limit": options.rate,
        "max_1s_window": stats.get("max_1s_window"),
        "workers": options.workers,
        "partitions": settings.partitions,
        "worker_rss_mb_max": round(pool.max_rss_mb, 1),
        "status": progress["status"],
    }
    return summary


def wait_until_finished(
    settings: Settings, campaign_id: int, pool: WorkerPool, options: DemoOptions, began: float
) -> Any:
    bar = ProgressLine(f"campaign {campaign_id} send   ") if options.show_progress else None
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        store = CampaignStore(conn)
        while True:
            progress = store.progress(campaign_id)
            pool.sample_rss()
            if bar:
                bar.update(
                    progress.terminal,
                    progress.total,
                    f"{progress.send_rate:,.0f}/s sent={progress['sent']:,}",
                )
            if progress.finished or progress["status"] in SETTLED:
                if progress.finished and progress["status"] == "sending":
                    store.finish(campaign_id)
                    progress = store.progress(campaign_id)
                break
            if not pool.alive():
                raise FlashsendError(f"all workers exited; see {pool.log_dir}")
            if time.monotonic() - began > options.timeout_s:
                break
            time.sleep(PROGRESS_POLL_S)
    if bar:
        bar.update(progress.terminal, progress.total, f"{progress.send_rate:,.0f}/s", force=True)
        bar.close()
    return progress
