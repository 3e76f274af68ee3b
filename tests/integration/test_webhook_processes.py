"""`flashsend webhook --processes N`: N real webhook processes answer on one port, a dead one
is replaced, and a second webhook on a taken port refuses to start; `flashsend feedback
bench` reports what it promises."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from flashsend.lab.feedback_bench import BenchOptions, CertServer, Signer, run_bench, ses_event
from flashsend.lab.feedback_run import WebhookProcess, wait_for, with_feedback
from flashsend.settings import Settings, settings_env
from producers.mail_topics import ensure_mail_topics
from producers.sns_sign import generate_signing_key
from tests.integration.feedback_helpers import http, total_records


@pytest.fixture
def signer_and_certs() -> Iterator[tuple[Signer, CertServer]]:
    key, cert = generate_signing_key()
    certs = CertServer(cert)
    yield Signer("", f"http://{certs.authority}/c.pem", key), certs
    certs.close()


def test_processes_share_the_port_and_a_dead_one_is_replaced(
    settings: Settings, tmp_path: Path, signer_and_certs: tuple[Signer, CertServer]
) -> None:
    signer, certs = signer_and_certs
    s = with_feedback(settings, webhook_processes=2, sns_cert_authority=certs.authority)
    signer.topic = s.sns_topic_arns[0]
    ensure_mail_topics(s)
    webhook = WebhookProcess.start(s, tmp_path)
    try:
        children = {p.pid for p in psutil.Process(webhook.proc.pid).children()}
        assert len(children) == 2
        assert webhook.answering_pids(2) == children  # start waits for both

        headers = {"x-amz-sns-message-type": "Notification", "Content-Type": "text/plain"}
        for i in range(40):  # one connection each: both processes take some
            body = signer.body(ses_event("Delivery", f"p{i}@procs.flashsend.test", None))
            assert http("POST", webhook.sns_url, body, headers).status == 200
        assert total_records(s, s.topic_mail_events) == 40

        victim = sorted(children)[0]
        os.kill(victim, signal.SIGKILL)

        def replaced() -> set[int] | None:
            now = {p.pid for p in psutil.Process(webhook.proc.pid).children()}
            return now if len(now) == 2 and victim not in now else None

        now = wait_for("the dead webhook process replaced", replaced, 30)
        wait_for("both answer again", lambda: webhook.answering_pids(2) == now, 30, 0.2)
    finally:
        webhook.stop()
    assert not any(psutil.pid_exists(pid) for pid in children - {victim})


def test_a_second_webhook_on_a_taken_port_refuses_to_start(
    settings: Settings, tmp_path: Path
) -> None:
    s = with_feedback(settings, webhook_processes=2)
    webhook = WebhookProcess.start(s, tmp_path)
    try:
        for processes in ("2", "1"):
            second = subprocess.run(
                [sys.executable, "-m", "flashsend.cli", "webhook", "--processes", processes],
                env={**os.environ, **settings_env(s)},
                capture_output=True,
                timeout=60,
            )
            assert second.returncode != 0, processes
            assert b"in use" in second.stdout + second.stderr, second
        assert webhook.healthy()
    finally:
        webhook.stop()


def test_feedback_bench_reports_per_path_figures(settings: Settings) -> None:
    began = time.monotonic()
    result = run_bench(
        settings,
        BenchOptions(events=300, concurrency=8, pauses=1, processes=2, sqs=False, firehose=False),
        log=print,
    )
    path = result["paths"]["webhook"]
    assert path["records_on_kafka"] == 300
    assert path["processes"] == 2
    assert path["events_per_s"] > 0 and path["cpu_us_per_event"] > 0
    assert result["events_per_s"] == path["events_per_s"]
    assert result["cpu_us_per_event"] == path["cpu_us_per_event"]
    assert set(path["latency_ms"]) == {"p50", "p90", "p99", "max"}
    assert set(path["load_generator"]) == {"cpu_us_per_event", "cores"}
    assert {"cpus", "busy_cores", "other_cores"} <= set(result["machine"])
    assert result["services"]["webhook_processes"] == 2
    assert "kafka" in result["services"]["stack"]
    assert result["feedback_agent"]["backlog_events"] >= 300
    assert result["pause_delay_ms"]["samples"] == 1
    print(f"bench test took {time.monotonic() - began:.1f}s")
