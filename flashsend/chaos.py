"""`flashsend chaos`: a campaign under faults, judged by the provider's own record.

While the campaign runs: SIGKILL a worker every `kill_every_s` (a supervisor starts a
replacement, as systemd would), stop and restart the broker (same data dir) and PostgreSQL
(immediate shutdown = crash recovery), optionally freeze a worker past the rebalance (zombie)
and let the SES stand-in accept calls without answering. Then wait for the campaign to finish
(reconcile turns expired leases into `unknown`) and check the invariants:

- duplicates == 0 (counted by the stand-in, per destination);
- lost == 0 (no recipient left pending/sending);
- unknown <= unknown_bound = kills x partitions x (lane capacity + one call)
                              + recipients of hung calls (counted by the stand-in).
"""

from __future__ import annotations

import os
import random
import signal
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
from flashsend.demo import ensure_users, standin_stats
from flashsend.settings import Settings
from flashsend.workers import WorkerPool
from infra.kafka import KafkaBroker
from infra.postgres import PostgresServer
from infra.ses_standin.admin import SesStandinAdmin
from producers.campaign import start_campaign
from producers.reconcile import Reconciler
from sinks.campaign_store import CampaignStore
from sinks.ses import SesSender, make_client
from streams.sender import MAX_ENTRIES, SenderConfig


@dataclass(frozen=True)
class ChaosOptions:
    users: int = 200_000
    workers: int = 3
    rate: float = 0.0
    kill_every_s: float = 5.0
    restart_broker_at: float | None = None
    restart_postgres_at: float | None = None
    zombie_at: float | None = None
    ses_hang_rate: float = 0.0
    lease_s: float = 20.0
    timeout_s: float = 900.0
    seed: int = 7


def _progress(settings: Settings, campaign_id: int) -> Any:
    """Campaign progress, or None while PostgreSQL is down."""
    try:
        with psycopg.connect(settings.pg_dsn, autocommit=True, connect_timeout=2) as conn:
            return CampaignStore(conn).progress(campaign_id)
    except psycopg.OperationalError:
        return None


def run_chaos(base: Settings, options: ChaosOptions, log: Any = print) -> dict[str, Any]:
    rng = random.Random(options.seed)
    # Workers get short timeouts so faults resolve within the run: a hung call times out after
    # ses_timeout_s, rows held by a killed worker become unknown after lease_s.
    settings = base.model_copy(
        update={"lease_s": options.lease_s, "ses_timeout_s": 3.0, "reconcile_interval_s": 2.0}
    )
    broker, postgres = KafkaBroker(settings), PostgresServer(settings)
    ses = SesStandinAdmin(settings.ses_endpoint_url or "")
    ensure_users(settings, options.users)
    SesSender(make_client(settings, timeout=10)).put_template(
        DEFAULT_TEMPLATE, DEFAULT_SUBJECT, DEFAULT_HTML, DEFAULT_TEXT
    )
    faults_before = ses.faults()
    ses.set_faults(p_hang=options.ses_hang_rate)
    stats_before: dict[str, Any] = dict(ses.stats())
    hung_before = int(stats_before.get("hung_recipients", 0))
    audience = f"({settings.audience_condition}) AND u.id <= {int(options.users)}"
    campaign_id = create_campaign(
        settings, name=f"chaos-{int(time.time())}", rate=options.rate, audience=audience
    )
    pool = WorkerPool(settings, settings.state_dir / "logs" / f"chaos-{campaign_id}", static=True)
    pool.start(options.workers)
    counters = {
        "kills": 0,
        "broker_restarts": 0,
        "postgres_restarts": 0,
        "zombies": 0,
        "worker_restarts": 0,
    }
    began = time.monotonic()
    try:
        started = start_campaign(settings, campaign_id)
        log(
            f"chaos: campaign {campaign_id}, {started.recipients:,} recipients, "
            f"{options.workers} workers"
        )
        final = _run_faults(
            settings, options, rng, campaign_id, pool, broker, postgres, counters, began, log
        )
    finally:
        pool.stop()
        ses.set_faults(p_hang=faults_before["p_hang"])
    # Last word: expire leases of rows held by killed workers, finish the campaign.
    with Reconciler(settings) as reconciler:
        reconciler.reconcile(campaign_id, lease_s=0.0)
    final = _progress(settings, campaign_id)
    stats = standin_stats(settings, campaign_id)
    hung = int(stats.get("hung_recipients", 0)) - hung_before
    per_kill = settings.partitions * (SenderConfig(partitions=1).lane_capacity + MAX_ENTRIES)
    unknown_bound = (counters["kills"] + counters["zombies"]) * per_kill + hung
    lost = int(final["pending"] + final["sending"])
    result = {
        "campaign_id": campaign_id,
        "recipients": final.total,
        "sent": final["sent"],
        "failed": final["failed"],
        "skipped": final["skipped"],
        "unknown": final["unknown"],
        "pending": final["pending"],
        "sending": final["sending"],
        "cancelled": final["cancelled"],
        "accepted_by_ses": stats.get("accepted"),
        "duplicates": stats.get("duplicates"),
        **counters,
        "hung_recipients": hung,
        "unknown_bound": unknown_bound,
        "unknown_per_kill": round(final["unknown"] / counters["kills"], 1)
        if counters["kills"]
        else None,
        "lost": lost,
        "elapsed_s": round(time.monotonic() - began, 1),
    }
    result["invariants_ok"] = (
        result["duplicates"] == 0 and lost == 0 and final["unknown"] <= unknown_bound
    )
    return result


def _run_faults(
    settings: Settings,
    options: ChaosOptions,
    rng: random.Random,
    campaign_id: int,
    pool: WorkerPool,
    broker: KafkaBroker,
    postgres: PostgresServer,
    counters: dict[str, int],
    began: float,
    log: Any,
) -> Any:
    next_kill = options.kill_every_s if options.kill_every_s > 0 else float("inf")
    broker_at, pg_at, zombie_at = (
        options.restart_broker_at,
        options.restart_postgres_at,
        options.zombie_at,
    )
    zombie: Any = None
    while True:
        t = time.monotonic() - began
        progress = _progress(settings, campaign_id)
        if progress is not None and progress.finished:
            return progress
        if t > options.timeout_s:
            log(f"chaos: timeout after {t:.0f}s")
            return progress
        busy = progress is None or progress["pending"] > 0
        if busy and t >= next_kill and pool.alive():
            victim = rng.choice(pool.alive())
            pool.kill(victim, signal.SIGKILL)
            counters["kills"] += 1
            log(f"chaos: t={t:.1f}s SIGKILL worker pid {victim.pid}")
            pool.spawn()
            next_kill = t + options.kill_every_s
        if broker_at is not None and t >= broker_at:
            broker_at = None
            log(f"chaos: t={t:.1f}s stopping the broker")
            broker.stop()
            time.sleep(3)
            broker.start()
            counters["broker_restarts"] += 1
            log(f"chaos: t={time.monotonic() - began:.1f}s broker back")
        if pg_at is not None and t >= pg_at:
            pg_at = None
            log(f"chaos: t={t:.1f}s stopping postgres (immediate)")
            postgres.stop(mode="immediate")
            time.sleep(3)
            postgres.start()
            counters["postgres_restarts"] += 1
            log(f"chaos: t={time.monotonic() - began:.1f}s postgres back")
        if zombie_at is not None and t >= zombie_at and pool.alive():
            zombie_at = None
            zombie = rng.choice(pool.alive())
            os.kill(zombie.pid, signal.SIGSTOP)
            counters["zombies"] += 1
            log(f"chaos: t={t:.1f}s SIGSTOP worker pid {zombie.pid} (zombie)")
            zombie_thaw = t + 15.0  # past session.timeout → its partitions are reassigned
        if zombie is not None and t >= zombie_thaw:
            os.kill(zombie.pid, signal.SIGCONT)
            log(f"chaos: t={t:.1f}s SIGCONT worker pid {zombie.pid}")
            zombie = None
        for proc in list(pool.procs):
            if proc.poll() is not None and proc.returncode not in (-signal.SIGKILL,):
                # A worker that died by itself (e.g. broker gone too long): restart it, like a
                # supervisor would.
                pool.procs.remove(proc)
                pool.spawn()
                counters["worker_restarts"] += 1
                log(f"chaos: t={t:.1f}s worker {proc.pid} exited ({proc.returncode}); restarted")
        time.sleep(0.5)
