"""Every long-running process serves /metrics, and every metric the shipped dashboard and alert
rules use is exported by one of them.

Five real processes (campaign, mail and feedback workers, the order-outbox relay, the webhook),
each on its own metrics port, after a little real work: a small campaign, one poison doorbell,
SES events on mail.events. The scrapes are what Prometheus would read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings, settings_env
from infra.process import free_port, terminate
from producers.campaign import start_campaign
from producers.ses_events import event_id
from sinks.users import seed_users
from tests.conftest import LocalStack
from tests.integration.campaign_helpers import new_campaign, wait_finished
from tests.integration.feedback_helpers import codec
from tests.integration.mail_fixtures import mail_settings
from tests.unit.test_observability_files import used_metrics

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def probe(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_scrape(port: int, wanted: set[str], timeout: float = 90.0) -> Samples:
    """Scrape until every name in `wanted` has a sample (gauges are cached 5 s)."""
    deadline = time.monotonic() + timeout
    last: Samples = {}
    while time.monotonic() < deadline:
        try:
            last = scrape(port)
        except OSError:
            last = {}
        if wanted <= last.keys():
            return last
        time.sleep(1.0)
    raise AssertionError(f"port {port}: missing {sorted(wanted - last.keys())}")


def ses_record(campaign: int, event_type: str, to: str) -> dict[str, object]:
    message_id = f"ses-{uuid.uuid4()}"
    return {
        "event_id": event_id(message_id, event_type, to),
        "event_type": event_type,
        "version": 1,
        "occurred_at": int(time.time() * 1000),
        "recipient": to,
        "ses_message_id": message_id,
        "sns_message_id": str(uuid.uuid4()),
        "campaign_id": campaign,
        "seq": None,
        "configuration_set": "marketing",
        "tags": {},
        "bounce_type": None,
        "bounce_sub_type": None,
        "complaint_type": "abuse" if event_type == "Complaint" else None,
        "detail": None,
        "source": "event_publishing",
        "received_at": int(time.time() * 1000),
    }


@pytest.fixture
def obs(stack: LocalStack) -> Settings:
    return mail_settings(stack, schema_registry_url="mock://flashsend")


@pytest.fixture
def processes(obs: Settings, tmp_path: Path) -> Iterator[dict[str, int]]:
    """role -> metrics port of a running process of that role."""
    ports = {role: free_port() for role in ("campaign", "mail", "feedback", "relay", "webhook")}
    pools: list[WorkerPool] = []
    others: list[subprocess.Popen[bytes]] = []
    try:
        for role in ("campaign", "mail", "feedback"):
            pool = WorkerPool(
                obs.model_copy(update={"metrics_port": ports[role]}),
                tmp_path / role,
                loglevel="info",
                role=role,
            )
            pool.start(1)
            pools.append(pool)
        commands = {
            "relay": ["relay", "--outbox", "orders"],
            "webhook": ["webhook", "--processes", "1", "--port", str(free_port())],
        }
        for role, argv in commands.items():
            env = {
                **os.environ,
                **settings_env(obs.model_copy(update={"metrics_port": ports[role]})),
                "FLASHSEND_WORKER_EXIT_WITH_PARENT": "true",
            }
            with open(tmp_path / f"{role}.log", "ab") as log:
                others.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "flashsend.cli", *argv],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
                )
        yield ports
    finally:
        for proc in others:
            if proc.poll() is None:
                terminate(proc.pid, timeout=20)
        for pool in pools:
            pool.stop()


def test_every_process_serves_its_lag_and_counters_and_every_used_metric_exists(
    obs: Settings, processes: dict[str, int]
) -> None:
    s = obs
    seed_users(s.pg_dsn, 60)
    cid = new_campaign(s, rate=0)
    start_campaign(s, cid)
    wait_finished(s, cid, timeout=120)
    producer = Producer({"bootstrap.servers": s.kafka_bootstrap})
    producer.produce(s.topic_recipients, key=b"1", value=b"not avro at all")  # poison
    ses = codec(s, "ses_event")
    with psycopg.connect(s.pg_dsn) as conn:
        emails = [
            str(r[0])
            for r in conn.execute(
                "SELECT u.email FROM campaign_recipients r JOIN users u ON u.id = r.user_id "
                "WHERE r.campaign_id = %s AND r.status = 'sent' LIMIT 20",
                (cid,),
            )
        ]
    for i, email in enumerate(emails):
        for kind in ("Send", "Complaint") if i == 0 else ("Send",):
            producer.produce(
                s.topic_mail_events,
                key=email.encode(),
                value=ses.encode(ses_record(cid, kind, email)),
                headers=[("flashsend.schema", b"ses_event")],
            )
    assert producer.flush(10) == 0
    del producer

    lag = "flashsend_consumer_lag"
    wanted = {
        "campaign": {lag, "flashsend_dead_letters_total", "flashsend_recipients_total"},
        "mail": {lag, "flashsend_outbox_backlog", "flashsend_mail_total"},
        "feedback": {lag, "flashsend_feedback_events_total", "flashsend_complaint_rate"},
        "relay": {"flashsend_outbox_oldest_age_seconds", "flashsend_outbox_published_total"},
        "webhook": {"flashsend_webhook_requests_total", "flashsend_outbox_backlog"},
    }
    scraped = {role: wait_scrape(port, wanted[role]) for role, port in processes.items()}

    # Lag is per partition of the process's own topic and group.
    topics = {
        "campaign": s.topic_recipients,
        "mail": s.topic_order_events,
        "feedback": s.topic_mail_events,
    }
    for role, topic in topics.items():
        partitions = {
            labels["partition"] for labels, _ in scraped[role][lag] if labels["topic"] == topic
        }
        expected = s.partitions if role == "campaign" else s.order_events_partitions
        assert partitions == {str(p) for p in range(expected)}, (role, scraped[role][lag])
    dead = scraped["campaign"]["flashsend_dead_letters_total"]
    assert any(labels["topic"] == s.topic_dlq and value >= 1 for labels, value in dead)
    complaint = scraped["feedback"]["flashsend_complaint_rate"]
    assert any(labels["campaign"] == str(cid) and value > 0 for labels, value in complaint)
    ingested = scraped["feedback"]["flashsend_events_ingested_total"]
    assert any(labels["topic"] == s.topic_mail_events and v >= 21 for labels, v in ingested)

    exported = set().union(*(samples.keys() for samples in scraped.values()))
    missing = {
        name: sorted(where) for name, where in used_metrics().items() if name not in exported
    }
    assert missing == {}, f"used by the dashboard/alerts but exported by no process: {missing}"
    json.dumps(scraped["campaign"])  # the scrape is plain data (for a failure message)

    # The scheduler's probes, on the same port: alive (the loop ticks) and ready (assigned,
    # stores answering).
    for role, port in processes.items():
        assert probe(port, "/healthz")[0] == 200, (role, probe(port, "/healthz"))
        deadline = time.monotonic() + 60  # a group's first assignment can take a while
        while probe(port, "/readyz")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert probe(port, "/readyz") == (200, "ready\n"), role
