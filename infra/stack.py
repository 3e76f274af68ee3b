"""The local stack: broker, PostgreSQL and the SES stand-in, managed in one state dir.

`up` is idempotent (services already running are left alone) and, if a service fails to
start, stops the ones it started so nothing is left half-running.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flashsend.settings import Settings
from infra.api_service import ApiService
from infra.elasticmq import ElasticMq
from infra.errors import StackError
from infra.kafka import KafkaCluster
from infra.migrate import apply_migrations
from infra.postgres import PostgresServer
from infra.process import ManagedProcess, port_open, require_free_port, wait_until
from infra.puller_service import PullerService
from infra.registry import SchemaRegistry
from infra.ses_standin.journal import JOURNAL_FILE
from infra.webhook_service import WebhookService


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    running: bool
    endpoint: str
    start_s: float | None = None


# The stand-in rebuilds its indexes from its journal before it answers: 3.0M messages
# (1.6 GB, two 1M benches and two small ones) took 27.3 s on this machine when it was fast,
# and it runs up to 2x slower at times. Nothing trims the journal, so the wait scales with it.
REPLAY_S_PER_GB = 40.0
REPLAY_NOTICE_BYTES = 256 * 1024 * 1024


def standin_start_timeout(journal_bytes: int, base_s: float = 30.0) -> float:
    """Seconds to wait for the stand-in: `base_s` plus its journal's replay allowance."""
    return base_s + REPLAY_S_PER_GB * journal_bytes / 1e9


def replay_notice(journal_bytes: int, endpoint: str) -> str | None:
    """The line `up` prints before a long replay, or None for a small journal."""
    if journal_bytes < REPLAY_NOTICE_BYTES:
        return None
    return (
        f"  ses       replaying {journal_bytes / 1e9:.1f} GB of accepted mail "
        f"(up to {standin_start_timeout(journal_bytes):.0f}s); "
        f"`curl -X POST {endpoint}/_admin/reset` empties it"
    )


class SesStandin:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.process = ManagedProcess("ses", settings.state_dir / "run")

    def running(self) -> bool:
        return self.process.pid() is not None

    def ready(self) -> bool:
        if not port_open(self.settings.ses_port):
            return False
        from infra.ses_standin.admin import SesStandinAdmin

        try:
            return SesStandinAdmin(self.endpoint).health()
        except OSError:
            return False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.settings.ses_port}"

    @property
    def state_dir(self) -> Path:
        return self.settings.state_dir / "ses"

    @property
    def journal(self) -> Path:
        return self.state_dir / JOURNAL_FILE

    def journal_bytes(self) -> int:
        try:
            return self.journal.stat().st_size
        except FileNotFoundError:
            return 0

    def start(self, *, timeout: float | None = None, log: Callable[[str], None] = print) -> float:
        """Start and wait until it answers; by default the wait allows for the replay."""
        if self.running():
            return 0.0
        s = self.settings
        require_free_port(s.ses_port, "the SES stand-in", "FLASHSEND_SES_PORT")
        size = self.journal_bytes()
        if timeout is None:
            timeout = standin_start_timeout(size)
        notice = replay_notice(size, self.endpoint)
        if notice is not None:
            log(notice)
        self.process.start(
            [
                sys.executable,
                "-m",
                "infra.ses_standin",
                "--host",
                "127.0.0.1",
                "--port",
                str(s.ses_port),
                "--state-dir",
                str(self.state_dir),
                "--max-send-rate",
                str(s.ses_max_send_rate),
                "--latency-ms",
                str(s.ses_latency_ms),
                *(["--resume-events"] if s.ses_resume_events else []),
            ]
        )
        try:
            return wait_until(
                self.ready,
                timeout=timeout,
                what="SES stand-in",
                alive=self.running,
                log=self.process.log_file,
            )
        except StackError:
            self.process.stop()
            raise

    def stop(self) -> bool:
        return self.process.stop()


class Stack:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.kafka = KafkaCluster(settings)
        self.postgres = PostgresServer(settings)
        self.ses = SesStandin(settings)
        self.registry = SchemaRegistry(settings)  # operations
        self.webhook = WebhookService(settings)  # deliverability
        self.sqs = ElasticMq(settings)  # SES events through SQS
        self.puller = PullerService(settings)
        self.api = ApiService(settings)

    def _services(
        self, log: Callable[[str], None] = print, *, every: bool = False
    ) -> list[tuple[str, Callable[[], float], Callable[[], bool]]]:
        """The local services in start order: those of `local_services`, or `every` one."""
        wanted = self.settings.local_services
        table = [
            ("postgres", self.postgres.start, self.postgres.stop),
            ("kafka", self.kafka.start, lambda: self.kafka.stop()),
            ("ses", lambda: self.ses.start(log=log), self.ses.stop),
            ("registry", self.registry.start, self.registry.stop),
            ("sqs", self._start_sqs, self.sqs.stop),  # after ses: it subscribes the queue
            ("puller", self.puller.start, self.puller.stop),
            ("webhook", self.webhook.start, self.webhook.stop),  # after ses: it subscribes
            ("api", self.api.start, self.api.stop),
        ]
        return [entry for entry in table if every or entry[0] in wanted]

    def service_names(self, *, every: bool = False) -> list[str]:
        return [name for name, _start, _stop in self._services(every=every)]

    def _start_sqs(self) -> float:
        waited = self.sqs.start()
        from infra.aws_apply import ensure_local_queues

        ensure_local_queues(self.settings)
        return waited

    def up(self, *, migrate: bool = True, log: Callable[[str], None] = print) -> dict[str, float]:
        """Start every local service; return start seconds per service (0.0 = was running)."""
        timings: dict[str, float] = {}
        started: list[Callable[[], bool]] = []
        try:
            for name, start, stop in self._services(log):
                began = time.monotonic()
                waited = start()
                timings[name] = round(time.monotonic() - began, 2) if waited else 0.0
                if waited:
                    started.append(stop)
                state = f"started in {timings[name]}s" if waited else "running"
                log(f"  {name:<9} {state}")
            if migrate:
                applied = apply_migrations(self.settings.pg_dsn)
                log(f"  migrations {len(applied)} applied")
        except BaseException:
            for stop in reversed(started):
                stop()
            raise
        return timings

    def down(self) -> list[str]:
        """Stop every local service that runs, listed in `local_services` or not: one started
        under other settings (`sqs` for a run, then `down` without it) is stopped too."""
        stopped = []
        for name, _start, stop in reversed(self._services(every=True)):
            if stop():
                stopped.append(name)
        return stopped

    def status(self) -> list[ServiceStatus]:
        s = self.settings
        return [
            ServiceStatus("kafka", self.kafka.ready(), s.kafka_bootstrap),
            ServiceStatus("postgres", self.postgres.ready(), s.pg_dsn),
            ServiceStatus("ses", self.ses.ready(), s.ses_endpoint or "real Amazon SES"),
            *(
                [ServiceStatus("registry", self.registry.ready(), s.schema_registry_url)]
                if "registry" in s.local_services
                else []
            ),
            *(
                [ServiceStatus("sqs", self.sqs.ready(), self.sqs.endpoint)]
                if "sqs" in s.local_services
                else []
            ),
            *(
                [ServiceStatus("puller", self.puller.running(), s.sqs_queue)]
                if "puller" in s.local_services
                else []
            ),
            *(
                [ServiceStatus("webhook", self.webhook.ready(), self.webhook.endpoint)]
                if "webhook" in s.local_services and self.webhook.ever_started()
                else []
            ),
            *(
                [ServiceStatus("api", self.api.ready(), self.api.endpoint)]
                if "api" in s.local_services and self.api.ever_started()
                else []
            ),
        ]
