"""The Campaign HTTP API as a service of the local stack (`flashsend up`): `flashsend api` on
FLASHSEND_API_PORT (loopback), its pid and log under the state dir like the webhook's."""

from __future__ import annotations

import json
import os
import sys
import urllib.request

from flashsend.settings import Settings, settings_env
from infra.errors import StackError
from infra.process import ManagedProcess, port_open, require_free_port, wait_until


class ApiService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.process = ManagedProcess("api", settings.state_dir / "run")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.settings.api_port}"

    def running(self) -> bool:
        return self.process.pid() is not None

    def ever_started(self) -> bool:
        return self.process.log_file.exists()

    def ready(self) -> bool:
        if not port_open(self.settings.api_port):
            return False
        try:
            with urllib.request.urlopen(self.endpoint + "/healthz", timeout=2) as response:
                return bool(json.loads(response.read()).get("ok"))
        except (OSError, ValueError):
            return False

    def start(self, *, timeout: float = 60.0) -> float:
        if self.running():
            return 0.0
        s = self.settings
        require_free_port(s.api_port, "the API", "FLASHSEND_API_PORT")
        self.process.start(
            [sys.executable, "-m", "flashsend.cli", "api", "--port", str(s.api_port)],
            env={**os.environ, **settings_env(s), "PYTHONUNBUFFERED": "1"},
        )
        try:
            return wait_until(
                self.ready,
                timeout=timeout,
                what="API",
                alive=self.running,
                log=self.process.log_file,
            )
        except StackError:
            self.process.stop()
            raise

    def stop(self) -> bool:
        return self.process.stop()
