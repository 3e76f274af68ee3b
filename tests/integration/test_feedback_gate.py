"""Campaigns do not outrun their feedback: a real feedback worker reports how long its oldest
unapplied event has waited, and campaign workers hold their calls while that is over
`feedback_max_lag_s` (streams/rules/feedback_lag.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from flashsend.lab.mail_bench import spawn_worker
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from producers.campaign import start_campaign
from producers.mail_topics import ensure_mail_topics
from sinks.users import seed_users
from tests.integration.campaign_helpers import new_campaign, stats, statuses, wait_finished
from tests.integration.feedback_helpers import delivered, deliveries, done_campaign, produce_events
from tests.integration.mail_fixtures import stop_process, wait_for
from tests.integration.ops_helpers import cli, last_json

LAG_SQL = (
    "SELECT count(*), count(waiting_since),"
    " extract(epoch FROM now() - min(waiting_since))::float8"
    " FROM feedback_progress WHERE reported_at > now() - interval '2 seconds'"
)


def _progress(settings: Settings) -> tuple[int, int, float | None]:
    """Fresh reports: how many, how many with events waiting, and the oldest wait (s)."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(LAG_SQL).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), row[2]


def _caught_up(settings: Settings) -> bool:
    reports, waiting, _ = _progress(settings)
    return reports >= 1 and waiting == 0


def test_a_stuck_feedback_agent_reports_a_growing_lag_and_clears_it_once_caught_up(
    settings: Settings, tmp_path: Path
) -> None:
    ensure_mail_topics(settings)
    cid = done_campaign(settings)
    worker = spawn_worker(settings, "feedback", tmp_path)
    try:
        produce_events(settings, deliveries(settings, cid, 50, first_offset=0))
        wait_for("first events applied", lambda: delivered(settings, cid) == 50, 90)
        wait_for("caught up, reported", lambda: _caught_up(settings), 10)
        with psycopg.connect(settings.pg_dsn) as lock:
            # The agent's transaction writes feedback_seen: it waits on this lock.
            lock.execute("LOCK TABLE feedback_seen IN EXCLUSIVE MODE")
            produce_events(settings, deliveries(settings, cid, 50, first_offset=50))
            wait_for("the lag reported past 3 s", lambda: (_progress(settings)[2] or 0) > 3.0, 20)
            reports, waiting, lag = _progress(settings)
            # Every assigned partition reports; only the one the events went to waits.
            assert reports >= 1 and waiting == 1 and lag is not None and lag < 10, (reports, lag)
            assert delivered(settings, cid) == 50  # nothing applied meanwhile
            lock.rollback()
        wait_for("the rest applied", lambda: delivered(settings, cid) == 100, 60)
        wait_for("caught up again", lambda: _caught_up(settings), 10)
    finally:
        stop_process(worker)


class BehindAgent:
    """A feedback agent's report saying events have waited `lag_s`, kept fresh until stopped
    (what a worker whose agent falls behind reads)."""

    def __init__(self, settings: Settings, lag_s: float) -> None:
        self.settings, self.lag_s = settings, lag_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with psycopg.connect(self.settings.pg_dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                conn.execute(
                    "INSERT INTO feedback_progress AS f (topic, partition, waiting_since,"
                    " reported_at) VALUES (%s, 0, now() - make_interval(secs => %s), now())"
                    " ON CONFLICT (topic, partition) DO UPDATE"
                    " SET waiting_since = excluded.waiting_since, reported_at = now()",
                    (self.settings.topic_mail_events, self.lag_s),
                )
                self._stop.wait(0.3)
            conn.execute("DELETE FROM feedback_progress")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _accepted(settings: Settings, cid: int) -> int:
    return int(stats(settings, cid)["accepted"])


def test_campaigns_hold_their_calls_while_the_feedback_agent_is_behind(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_users(settings.pg_dsn, 3_000)
    cid = new_campaign(settings, rate=300)
    pool = WorkerPool(settings, settings.state_dir / f"logs-{cid}")
    pool.start(1)
    behind: BehindAgent | None = None
    try:
        start_campaign(settings, cid)
        wait_for("sending", lambda: statuses(settings, cid).get("sent", 0) >= 300, 60)
        behind = BehindAgent(settings, lag_s=settings.feedback_max_lag_s + 2)
        time.sleep(1.5)  # the cache's next poll closes the gate; calls in flight end
        held_from = _accepted(settings, cid)
        time.sleep(3.0)
        assert _accepted(settings, cid) == held_from, "calls went out while the agent was behind"
        # `campaign status` says why the campaign stands still.
        code, out = cli(settings, monkeypatch, capsys, "campaign", "status", str(cid))
        lag = settings.feedback_max_lag_s + 2
        assert code == 0 and f"waiting for the feedback agent: {int(lag)}." in out, out
        code, out = cli(settings, monkeypatch, capsys, "campaign", "status", str(cid), "--json")
        assert code == 0 and last_json(out)["feedback_lag_s"] >= lag, out
        behind.stop()
        behind = None
        wait_finished(settings, cid, pool, timeout=120)
    finally:
        if behind is not None:
            behind.stop()
        pool.stop()
    code, out = cli(settings, monkeypatch, capsys, "campaign", "status", str(cid), "--json")
    assert code == 0 and last_json(out)["feedback_lag_s"] is None, out  # no agent reports now
    st = statuses(settings, cid)
    assert st.get("pending", 0) == 0 and st.get("sending", 0) == 0 and st.get("unknown", 0) == 0
    s = stats(settings, cid)
    assert s["duplicates"] == 0 and s["accepted"] == st["sent"]
