"""Start, find and stop the stack's background processes (broker, stand-in, webhook).

Each service is a detached process (own session, so a Ctrl-C in the terminal does not kill it)
with a pid file and a log file in the state dir. Readiness is checked by the caller.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from infra.errors import PortInUse, ServiceFailed


@dataclass(frozen=True)
class ManagedProcess:
    name: str
    run_dir: Path

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    def pid(self) -> int | None:
        """The pid of the live process, or None (a stale pid file is removed)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if not pid_alive(pid):
            self.pid_file.unlink(missing_ok=True)
            return None
        return pid

    def start(
        self, argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> int:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=cwd,
            )
        self.pid_file.write_text(f"{proc.pid}\n")
        return proc.pid

    def stop(self, *, timeout: float = 15.0, sig: int = signal.SIGTERM) -> bool:
        """Stop the process (SIGTERM, then SIGKILL after timeout). True if one was running."""
        pid = self.pid()
        if pid is None:
            return False
        terminate(pid, timeout=timeout, sig=sig)
        self.pid_file.unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child (not yet reaped) still answers kill(0); treat it as dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def terminate(pid: int, *, timeout: float = 15.0, sig: int = signal.SIGTERM) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while pid_alive(pid):
            _reap(pid)
            time.sleep(0.02)
    _reap(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def require_free_port(port: int, service: str, setting: str) -> None:
    if port_open(port):
        raise PortInUse(
            f"port {port} needed by {service} is taken by another program: stop it or set "
            f"{setting} to a free port"
        )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    ready: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    alive: Callable[[], bool] | None = None,
    log: Path | None = None,
) -> float:
    """Poll ready() until it is true; return seconds waited. Fail fast if the process died."""
    start = time.monotonic()
    while True:
        if ready():
            return time.monotonic() - start
        if alive is not None and not alive():
            raise ServiceFailed(f"{what} exited during start-up; see {log}")
        if time.monotonic() - start > timeout:
            raise ServiceFailed(f"{what} not ready after {timeout:.0f}s; see {log}")
        time.sleep(0.05)
