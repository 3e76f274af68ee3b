"""A process that cannot reach Kafka or the schema registry at start stops with one line (not
librdkafka's log, not a traceback) and changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg

from flashsend.settings import Settings, settings_env
from infra.process import free_port
from producers.campaign import start_campaign
from sinks.users import seed_users
from tests.integration.campaign_helpers import new_campaign


def _cli(*args: str, settings: Settings) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "flashsend.cli", *args],
        env={**os.environ, **settings_env(settings)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _one_line(run: subprocess.Popen[str], what: str) -> str:
    _, stderr = run.communicate(timeout=120)
    lines = stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, (what, stderr[-2000:])
    return lines[0]


def test_without_kafka_workers_and_campaign_start_stop_in_one_line(settings: Settings) -> None:
    """The campaign role and `campaign start` create their topics through `ensure_topics`, the
    mail role through `ensure_mail_topics`: each waits for the broker, then raises, while
    librdkafka fails a connect every 50 ms. The refused start leaves its campaign a draft."""
    seed_users(settings.pg_dsn, 40)
    campaign = new_campaign(settings)
    bootstrap = f"127.0.0.1:{free_port()}"
    away = settings.model_copy(update={"kafka_bootstrap": bootstrap})
    runs = {
        "campaign role": _cli("worker", "--role", "campaign", settings=away),
        "mail role": _cli("worker", "--role", "mail", settings=away),
        "campaign start": _cli("campaign", "start", str(campaign), settings=away),
    }
    for what, run in runs.items():
        assert f"Kafka at {bootstrap} is not reachable" in _one_line(run, what), what
    with psycopg.connect(settings.pg_dsn) as conn:
        status = conn.execute("SELECT status FROM campaigns WHERE id = %s", (campaign,)).fetchone()
        rows = conn.execute(
            "SELECT count(*) FROM campaign_recipients WHERE campaign_id = %s", (campaign,)
        ).fetchone()
    assert status == ("draft",) and rows == (0,)
    assert start_campaign(settings, campaign).produced > 0  # the broker back: it starts


def test_a_worker_without_the_schema_registry_stops_in_one_line(settings: Settings) -> None:
    url = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    run = _cli(
        "worker",
        "--role",
        "feedback",
        settings=settings.model_copy(update={"schema_registry_url": url}),
    )
    line = _one_line(run, "feedback role")
    assert f"the schema registry at {url} does not answer" in line
    assert "flashsend up" in line and "FLASHSEND_SCHEMA_REGISTRY_URL" in line
