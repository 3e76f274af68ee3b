"""`flashsend webhook --processes N`: N webhook processes answering on one port.

Each child is a plain `flashsend webhook` that binds the port with SO_REUSEPORT, so the kernel
spreads connections over the children (by connection: SNS keeps connections open, so load
balances once it opens a few). One Python process serves /sns on one core; the children use
the others. The supervisor binds nothing itself: it checks the port is free before starting
(a second `flashsend webhook` must fail, not join in), restarts a child that dies (and gives
up, stopping the others, when one keeps dying right after its start), and stops them all on
SIGTERM/SIGINT. Children exit by themselves if the supervisor disappears.

Only the first child runs the outbox relay (one relay per table publishes anyway, under a
PostgreSQL advisory lock) and serves /metrics on FLASHSEND_METRICS_PORT; the others serve
their own /metrics on free ports (logged). /stats and the duplicate-MessageId cache are per
process.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from flashsend.errors import FlashsendError
from flashsend.settings import Settings, settings_env

log = logging.getLogger("flashsend.webhook.processes")

RESTART_BACKOFF_S = 1.0
CHECK_EVERY_S = 0.2
QUICK_EXIT_S = 10.0  # a child dying this soon after its start counts as a failed start
MAX_FAILED_STARTS = 5  # in a row, for one child: give up (bad settings, port taken…)
STOP_TIMEOUT_S = 15.0


class PortTaken(FlashsendError):
    """The webhook's port is already in use."""


class ChildrenFailing(FlashsendError):
    """A webhook process keeps exiting right after its start."""


def check_port_free(host: str, port: int) -> None:
    """Bind without SO_REUSEPORT once: a listener already there (ours or not) makes it fail."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise PortTaken(f"{host}:{port} is in use ({exc.strerror})") from exc


def child_argv(host: str, port: int, loglevel: str, index: int) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "flashsend.cli",
        "webhook",
        "--host",
        host,
        "--port",
        str(port),
        "--loglevel",
        loglevel,
        "--processes",
        "1",
        "--reuse-port",
    ]
    return argv if index == 0 else [*argv, "--no-relay"]


def child_env(settings: Settings, index: int) -> dict[str, str]:
    env = {**os.environ, **settings_env(settings), "FLASHSEND_WORKER_EXIT_WITH_PARENT": "true"}
    if index > 0 and settings.metrics_port != 0:
        env["FLASHSEND_METRICS_PORT"] = "-1"  # one fixed port cannot serve N processes
    return env


@dataclass
class Supervisor:
    settings: Settings
    host: str
    port: int
    loglevel: str
    processes: int
    children: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    started_at: dict[int, float] = field(default_factory=dict)
    failed_starts: dict[int, int] = field(default_factory=dict)
    restarts: int = 0
    _stopping: bool = False

    def start_child(self, index: int) -> None:
        self.started_at[index] = time.monotonic()
        self.children[index] = subprocess.Popen(
            child_argv(self.host, self.port, self.loglevel, index),
            env=child_env(self.settings, index),
        )

    def _replace(self, index: int, child: subprocess.Popen[bytes], code: int) -> None:
        quick = time.monotonic() - self.started_at[index] < QUICK_EXIT_S
        self.failed_starts[index] = self.failed_starts.get(index, 0) + 1 if quick else 0
        if self.failed_starts[index] >= MAX_FAILED_STARTS:
            raise ChildrenFailing(
                f"webhook process {index} exited {MAX_FAILED_STARTS} times right after its "
                f"start (last exit code {code}); see its log lines above"
            )
        self.restarts += 1
        log.warning(
            "ALERT webhook process %d (pid %s) exited with %s; restarting", index, child.pid, code
        )
        time.sleep(RESTART_BACKOFF_S)
        self.start_child(index)

    def stop(self, *_args: object) -> None:
        self._stopping = True

    def run(self) -> int:
        check_port_free(self.host, self.port)
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        parent = os.getppid()
        for index in range(self.processes):
            self.start_child(index)
        log.info("webhook supervisor: %d processes on %s:%s", self.processes, self.host, self.port)
        try:
            while not self._stopping:
                if self.settings.worker_exit_with_parent and os.getppid() != parent:
                    break
                for index, child in list(self.children.items()):
                    code = child.poll()
                    if code is not None and not self._stopping:
                        self._replace(index, child, code)
                time.sleep(CHECK_EVERY_S)
        finally:
            for child in self.children.values():
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for child in self.children.values():
                try:
                    child.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        return 0


def supervise(settings: Settings, host: str, port: int, loglevel: str, processes: int) -> int:
    """Run `processes` webhook processes on host:port until SIGTERM/SIGINT."""
    return Supervisor(settings, host, port, loglevel, processes).run()
