"""A `flashsend` command run as a service of the local stack (`flashsend up`): its pid and
log under the state dir, started with the stack's settings, ready once its health path
answers `{"ok": true}` on its port."""

from __future__ import annotations

import json
import os
import sys
import urllib.request

from flashsend.errors import FlashsendError
from flashsend.settings import Settings, settings_env
from infra.process import ManagedProcess, port_open, require_free_port, wait_until


class CommandService:
    """`flashsend <command> --port <port>`; subclasses name it and may add `after_ready`."""

    command = ""
    what = ""  # how messages name it: "the webhook"
    health_path = "/health"
    port_env = ""  # the setting that moves it: FLASHSEND_…_PORT

    def __init__(self, settings: Settings, port: int, name: str = "") -> None:
        """`name`: its pid and log files' name (default: the command), so a second instance
        beside the stack's (a benchmark's) is a process of its own."""
        self.settings = settings
        self.port = port
        self.process = ManagedProcess(name or self.command, settings.state_dir / "run")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def running(self) -> bool:
        return self.process.pid() is not None

    def ever_started(self) -> bool:
        """Listed by `status-stack` once started in this state dir (a crash then shows)."""
        return self.process.log_file.exists()

    def ready(self) -> bool:
        if not port_open(self.port):
            return False
        try:
            with urllib.request.urlopen(self.endpoint + self.health_path, timeout=2) as response:
                return bool(json.loads(response.read()).get("ok"))
        except (OSError, ValueError):
            return False

    def start(self, *, timeout: float = 60.0) -> float:
        if self.running():
            return 0.0
        require_free_port(self.port, self.what, self.port_env)
        self.process.start(
            [sys.executable, "-m", "flashsend.cli", self.command, "--port", str(self.port)],
            env={**os.environ, **settings_env(self.settings), "PYTHONUNBUFFERED": "1"},
        )
        try:
            waited = wait_until(
                self.ready,
                timeout=timeout,
                what=self.what.removeprefix("the "),
                alive=self.running,
                log=self.process.log_file,
            )
            self.after_ready()
            return waited
        except FlashsendError:  # StackError, or a set-up's UsageError
            self.process.stop()
            raise

    def after_ready(self) -> None:
        """What the service needs once it answers (the webhook's subscriptions)."""

    def stop(self) -> bool:
        return self.process.stop()
