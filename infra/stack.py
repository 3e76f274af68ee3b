"""The local stack: broker, PostgreSQL and the SES stand-in, managed in one state dir.

`up` is idempotent (services already running are left alone) and, if a service fails to
start, stops the ones it started so nothing is left half-running.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from flashsend.settings import Settings
from infra.errors import StackError
from infra.kafka import KafkaBroker
from infra.migrate import apply_migrations
from infra.postgres import PostgresServer
from infra.process import ManagedProcess, port_open, require_free_port, wait_until
from infra.registry import SchemaRegistry
from infra.webhook_service import WebhookService


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    running: bool
    endpoint: str
    start_s: float | None = None


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

    def start(self, *, timeout: float = 30.0) -> float:
        if self.running():
            return 0.0
        s = self.settings
        require_free_port(s.ses_port, "the SES stand-in", "FLASHSEND_SES_PORT")
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
                str(s.state_dir / "ses"),
                "--max-send-rate",
                str(s.ses_max_send_rate),
                "--latency-ms",
                str(s.ses_latency_ms),
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
        self.kafka = KafkaBroker(settings)
        self.postgres = PostgresServer(settings)
        self.ses = SesStandin(settings)
        self.registry = SchemaRegistry(settings)  # operations (issue 8)
        self.webhook = WebhookService(settings)  # deliverability (issue 5)

    def _services(self) -> list[tuple[str, Callable[[], float], Callable[[], bool]]]:
        wanted = self.settings.local_services
        table = [
            ("postgres", self.postgres.start, self.postgres.stop),
            ("kafka", self.kafka.start, self.kafka.stop),
            ("ses", self.ses.start, self.ses.stop),
            ("registry", self.registry.start, self.registry.stop),
            ("webhook", self.webhook.start, self.webhook.stop),  # after ses: it subscribes
        ]
        return [entry for entry in table if entry[0] in wanted]

    def up(self, *, migrate: bool = True, log: Callable[[str], None] = print) -> dict[str, float]:
        """Start every local service; return start seconds per service (0.0 = was running)."""
        timings: dict[str, float] = {}
        started: list[Callable[[], bool]] = []
        try:
            for name, start, stop in self._services():
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
        stopped = []
        for name, _start, stop in reversed(self._services()):
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
                [ServiceStatus("webhook", self.webhook.ready(), self.webhook.endpoint)]
                if "webhook" in s.local_services and self.webhook.ever_started()
                else []
            ),
        ]
