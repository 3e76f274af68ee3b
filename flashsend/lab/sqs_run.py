"""Running the SQS ingest path's pieces for the lab commands (outage, bench) and the tests.

A real `flashsend events pull` process, the queue's depth, and scratch settings that give a
run its own queues, SNS topic and configuration sets on a shared stack (the SES stand-in and
the SQS server outlive the run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashsend.lab.feedback_run import wait_for, with_feedback
from flashsend.settings import Settings, settings_env
from infra.process import terminate
from producers.sqs_client import boto3_sqs, queue_url

STOPPED_PREFIX = "stopped "


def with_sqs(settings: Settings, **overrides: Any) -> Settings:
    """`with_feedback` (own webhook port, topic, marketing configuration set) plus an own
    transactional configuration set and queue name."""
    suffix = uuid.uuid4().hex[:8]
    values: dict[str, Any] = {
        "transactional_configuration_set": f"transactional-{suffix}",
        "sqs_queue": f"events-{suffix}",
    }
    values.update(overrides)
    return with_feedback(settings, **values)


def queue_depth(settings: Settings, name: str | None = None) -> dict[str, int]:
    """Messages waiting and in flight (received, not yet deleted) in a queue."""
    client = boto3_sqs(settings)
    url = queue_url(settings, name)
    attributes = client.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return {
        "waiting": int(attributes.get("ApproximateNumberOfMessages", 0)),
        "in_flight": int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0)),
    }


def wait_queue_empty(settings: Settings, timeout: float, name: str | None = None) -> None:
    wait_for(
        f"queue {name or settings.sqs_queue} to empty",
        lambda: sum(queue_depth(settings, name).values()) == 0,
        timeout,
        every=0.2,
    )


@dataclass
class PullerProcess:
    """A real `flashsend events pull` process with these settings."""

    settings: Settings
    proc: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(
        cls, settings: Settings, log_dir: Path, *, pullers: int | None = None, timeout: float = 60
    ) -> PullerProcess:
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"puller-{uuid.uuid4().hex[:6]}.log"
        env = {
            **os.environ,
            **settings_env(settings),
            "PYTHONUNBUFFERED": "1",
            "FLASHSEND_WORKER_EXIT_WITH_PARENT": "true",
        }
        argv = [sys.executable, "-m", "flashsend.cli", "events", "pull", "--loglevel", "info"]
        if pullers is not None:
            argv += ["--pullers", str(pullers)]
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        puller = cls(settings, proc, log_path)
        try:
            wait_for("events puller to start", puller.started, timeout, every=0.05)
        except TimeoutError:
            puller.stop()
            raise
        return puller

    def started(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"events puller exited; see {self.log_path}")
        return "pulling " in self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process so far (from /proc)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> dict[str, Any]:
        """SIGTERM (batches in hand are finished); return the counters it logged at exit."""
        if self.proc.poll() is None:
            terminate(self.proc.pid, timeout=30)
        self.proc.wait(timeout=10)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        for line in reversed(self.log_path.read_text(errors="replace").splitlines()):
            _, found, rest = line.partition(STOPPED_PREFIX)
            if found and rest.startswith("{"):
                try:
                    return dict(json.loads(rest))
                except ValueError:
                    break
        return {}
