"""A worker that cannot reach Kafka at start stops with one line, not librdkafka's log."""

from __future__ import annotations

import os
import subprocess
import sys

from flashsend.settings import Settings, settings_env
from infra.process import free_port


def test_workers_without_kafka_stop_in_one_line(settings: Settings) -> None:
    """The campaign role creates its topics through `ensure_topics`, the mail role through
    `ensure_mail_topics`: both wait for the broker, then raise, while librdkafka fails a
    connect every 50 ms."""
    bootstrap = f"127.0.0.1:{free_port()}"
    env = {**os.environ, **settings_env(settings.model_copy(update={"kafka_bootstrap": bootstrap}))}
    runs = {
        role: subprocess.Popen(
            [sys.executable, "-m", "flashsend.cli", "worker", "--role", role],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for role in ("campaign", "mail")
    }
    for role, run in runs.items():
        _, stderr = run.communicate(timeout=120)
        lines = stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1, (role, stderr[-2000:])
        assert f"Kafka at {bootstrap} is not reachable" in lines[0], (role, lines[0])


def test_a_worker_without_the_schema_registry_stops_in_one_line(settings: Settings) -> None:
    url = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    run = subprocess.run(
        [sys.executable, "-m", "flashsend.cli", "worker", "--role", "feedback"],
        env={
            **os.environ,
            **settings_env(settings.model_copy(update={"schema_registry_url": url})),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stderr[-2000:]
    assert f"the schema registry at {url} does not answer" in lines[0]
    assert "flashsend up" in lines[0] and "FLASHSEND_SCHEMA_REGISTRY_URL" in lines[0]
