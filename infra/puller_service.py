"""`flashsend events pull` as a service of the local stack (`puller` in FLASHSEND_LOCAL_SERVICES).

With `sqs` (the local ElasticMQ, its queues and the stand-in's SQS subscription, see
`infra/stack.py`), this is the SQS ingest path end to end: stand-in → queue → puller →
mail.events. Ready once the process says it is pulling.
"""

from __future__ import annotations

import os
import sys
import time

from flashsend.settings import Settings, settings_env
from infra.errors import ServiceFailed
from infra.process import ManagedProcess

READY_LINE = "pulling "


class PullerService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.process = ManagedProcess("puller", settings.state_dir / "run")

    def running(self) -> bool:
        return self.process.pid() is not None

    def start(self, *, timeout: float = 60.0) -> float:
        if self.running():
            return 0.0
        began = time.monotonic()
        offset = self.process.log_file.stat().st_size if self.process.log_file.exists() else 0
        self.process.start(
            [sys.executable, "-m", "flashsend.cli", "events", "pull"],
            env={**os.environ, **settings_env(self.settings), "PYTHONUNBUFFERED": "1"},
        )
        while time.monotonic() - began < timeout:
            if READY_LINE in self.process.log_file.read_text(errors="replace")[offset:]:
                return time.monotonic() - began
            if not self.running():
                raise ServiceFailed(f"events puller exited; see {self.process.log_file}")
            time.sleep(0.1)
        self.process.stop()
        raise ServiceFailed(
            f"events puller not ready after {timeout:.0f}s; see {self.process.log_file}"
        )

    def stop(self) -> bool:
        return self.process.stop(timeout=30)
