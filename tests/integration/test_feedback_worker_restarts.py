"""A running feedback worker (`flashsend worker --role feedback`) goes on applying SES's events
after the broker and PostgreSQL restart under it, as in `flashsend chaos`:

- the broker stays down past the group session and PostgreSQL restarts (immediate shutdown)
  meanwhile, so the worker finds its pooled connections dead only when events arrive again;
- the worker is frozen past its session while PostgreSQL is down, so it is thrown out of the
  group and rejoins (a rebalance: revocation, a new epoch, a seek) before PostgreSQL is back.

Events are produced all along; each phase must end with every one of them applied once."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from flashsend.lab.mail_bench import spawn_worker
from flashsend.settings import Settings
from producers.mail_topics import ensure_mail_topics
from tests.conftest import LocalStack
from tests.integration.feedback_helpers import delivered, deliveries, done_campaign
from tests.integration.mail_fixtures import stop_process, wait_for


class Feed:
    """Delivery events of one campaign, 20 every 0.2 s, until stopped (buffered by the
    producer while the broker is down)."""

    def __init__(self, settings: Settings, campaign_id: int) -> None:
        self.settings, self.campaign_id = settings, campaign_id
        self.produced = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        s = self.settings
        producer = Producer(
            {"bootstrap.servers": s.kafka_bootstrap, "acks": "all", "message.timeout.ms": 300_000}
        )
        while not self._stop.is_set():
            for r in deliveries(s, self.campaign_id, 20, first_offset=0):
                producer.produce(
                    s.topic_mail_events, key=r.key, value=r.value, headers=list(r.headers)
                )
            self.produced += 20
            producer.poll(0)
            time.sleep(0.2)
        assert producer.flush(120) == 0

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(150)
        return self.produced


def test_events_are_applied_after_broker_and_postgres_restarts_and_a_rebalance(
    stack: LocalStack, settings: Settings, tmp_path: Path
) -> None:
    ensure_mail_topics(settings)
    cid = done_campaign(settings)
    worker = spawn_worker(settings, "feedback", tmp_path)
    feed = Feed(settings, cid)
    session = settings.group_session_timeout_s
    try:
        wait_for("events applied at first", lambda: delivered(settings, cid) >= 200, 90)
        stack.kafka.stop()
        try:
            time.sleep(session + 2)
            stack.postgres.stop(mode="immediate")
            stack.postgres.start()
        finally:
            stack.kafka.start()
        seen = feed.produced
        wait_for("events applied after the restarts", lambda: delivered(settings, cid) > seen, 90)

        os.kill(worker.pid, signal.SIGSTOP)
        try:
            stack.postgres.stop(mode="immediate")
            time.sleep(session + 4)
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        try:
            time.sleep(10)  # the rebalance runs while PostgreSQL is down
        finally:
            stack.postgres.start()
        seen = feed.produced
        wait_for("events applied after the rebalance", lambda: delivered(settings, cid) > seen, 90)
        total = feed.stop()
        wait_for("every event applied once", lambda: delivered(settings, cid) == total, 90)
        assert worker.poll() is None, "the feedback worker died"
    finally:
        feed.stop()
        stop_process(worker)
