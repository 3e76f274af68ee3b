"""A campaign worker stopped with SIGTERM (a rolling restart, a scheduler moving it) drains:
its calls in flight are answered and recorded, the rows it held but had not sent go back to
`pending`, and it exits within its grace. Nothing is left in doubt, so nothing can become
`unknown`; the next worker finishes the campaign with no duplicate."""

from __future__ import annotations

import signal
import time

import psycopg

from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from producers.campaign import start_campaign
from sinks.users import seed_users
from tests.integration.campaign_helpers import admin, new_campaign, stats, statuses, wait_finished

# Long enough that every lane has a call out when the signal lands.
LATENCY_MS = 600

HELD = """
SELECT count(*) FILTER (WHERE in_call_at IS NOT NULL),
       count(*)
  FROM campaign_recipients WHERE campaign_id = %s AND status = 'sending'
"""


def held_rows(settings: Settings, campaign_id: int) -> tuple[int, int]:
    """(rows in a call with no recorded outcome, rows claimed at all) of the campaign."""
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute(HELD, (campaign_id,)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_sigterm_drains_calls_in_flight_and_leaves_nothing_in_doubt(settings: Settings) -> None:
    seed_users(settings.pg_dsn, 6_000)
    cid = new_campaign(settings, rate=0)
    admin(settings).set_faults(latency_ms=LATENCY_MS)
    pool = WorkerPool(settings, settings.state_dir / f"logs-drain-{cid}")
    try:
        pool.start(1)
        start_campaign(settings, cid)
        deadline = time.monotonic() + 90
        while held_rows(settings, cid)[0] < 50 or statuses(settings, cid).get("sent", 0) < 300:
            assert time.monotonic() < deadline, statuses(settings, cid)
            time.sleep(0.05)
        [worker] = pool.alive()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)

        in_call, claimed = held_rows(settings, cid)
        assert (in_call, claimed) == (0, 0), statuses(settings, cid)
        assert "worker_stopped" in _reasons(settings, cid)

        admin(settings).set_faults(latency_ms=0)
        pool.start(1)
        done = wait_finished(settings, cid, pool, timeout=120)
    finally:
        admin(settings).set_faults(latency_ms=0)
        pool.stop()
    final = statuses(settings, cid)
    assert final.get("unknown", 0) == 0, final
    assert final["sent"] == done["sent"]
    seen = stats(settings, cid)
    assert seen["duplicates"] == 0, seen
    assert seen["accepted"] == final["sent"], (seen, final)


def _reasons(settings: Settings, campaign_id: int) -> set[str]:
    """Reasons rows were ever released with, read from the rows still pending or since
    re-claimed (the release writes `reason`)."""
    with psycopg.connect(settings.pg_dsn) as conn:
        rows = conn.execute(
            "SELECT DISTINCT reason FROM campaign_recipients "
            "WHERE campaign_id = %s AND reason IS NOT NULL",
            (campaign_id,),
        ).fetchall()
    return {str(r[0]) for r in rows}
