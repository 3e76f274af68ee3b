"""A topic missing from the metadata when the group rebalances (as right after a broker
restart) gets none of its partitions assigned; the feedback worker must take them once the
topic is back, not after Faust's default 5-minute metadata refresh (streams.faust_offsets:
METADATA_MAX_AGE_MS). Here the topic is deleted under a running worker and created again."""

from __future__ import annotations

from pathlib import Path

from flashsend.lab.feedback_run import wait_for
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from producers.mail_topics import ensure_mail_topics
from producers.topics import admin_client
from tests.integration.feedback_helpers import (
    delivered,
    deliveries,
    done_campaign,
    produce_events,
)


def test_the_feedback_worker_consumes_a_topic_that_came_back(
    settings: Settings, tmp_path: Path
) -> None:
    ensure_mail_topics(settings)
    pool = WorkerPool(settings, tmp_path / "feedback", role="feedback", loglevel="info")
    pool.start(1)
    try:
        log = tmp_path / "feedback" / "feedback-worker-0.log"
        wait_for("the worker's first assignment", lambda: "seeked to postgres" in _read(log), 90)
        admin = admin_client(settings.kafka_bootstrap)
        topic = settings.topic_mail_events
        admin.delete_topics([topic])[topic].result(30)
        wait_for("the topic gone", lambda: topic not in admin.list_topics(timeout=10).topics, 30)
        wait_for("a rebalance without it", lambda: "Ignoring missing topic" in _read(log), 60)
        ensure_mail_topics(settings)
        cid = done_campaign(settings)
        produce_events(settings, deliveries(settings, cid, 20, 0))
        # Well under the 5 minutes a default metadata refresh would leave it unconsumed.
        wait_for("the events applied", lambda: delivered(settings, cid) == 20, 90)
    finally:
        pool.stop()


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
