"""Worker processes started by `demo`, `chaos` and tests: real `flashsend worker` processes."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from flashsend.settings import Settings, settings_env
from infra.process import pid_alive, terminate

PR_SET_PDEATHSIG = 1
_PROBE_PORT = re.compile(rb"metrics on http://[^:/]+:(\d+)/metrics")
_EXCEPTION_LINE = re.compile(r"^(\w+\.)*\w*(Error|Exception|Unavailable|Timeout)\b:")
_ERROR_RECORD = re.compile(r"\[(ERROR|CRITICAL)\]")
_SESSIONS = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the parent (demo, chaos, a test) dies, so a
    killed parent never leaves workers sending in the background."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


@dataclass
class WorkerPool:
    settings: Settings
    log_dir: Path
    loglevel: str = "warning"
    role: str = "campaign"  # `flashsend worker --role`: campaign, mail or feedback
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    max_rss_mb: float = 0.0
    started: int = 0
    # Static group membership: each worker gets FLASHSEND_WORKER_INSTANCE = "<pool>-<slot>" and
    # a replacement reuses the slot of a dead worker (see Settings.worker_instance).
    static: bool = False
    slots: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    pool_id: str = field(default_factory=lambda: secrets.token_hex(3))
    log_files: dict[int, Path] = field(default_factory=dict)  # pid -> its stdout/stderr
    nice: int = 0  # added to the workers' niceness: > 0 yields the CPU to everything else
    # Each worker serves its probes (/healthz, /readyz) on a free port it logs (`ready`).
    probes: bool = False
    probe_ports: dict[int, int] = field(default_factory=dict)  # pid -> port, once logged
    # pid -> the application_name of its PostgreSQL sessions (PGAPPNAME), so a run can tell
    # when a killed worker's last statement has ended (`sessions_closed`).
    pg_names: dict[int, str] = field(default_factory=dict)

    def _free_slot(self) -> int:
        slot = 0
        while slot in self.slots and self.slots[slot].poll() is None:
            slot += 1
        return slot

    def spawn(self) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            **settings_env(self.settings),
            "PYTHONUNBUFFERED": "1",
            "FLASHSEND_WORKER_EXIT_WITH_PARENT": "true",
        }
        slot = self._free_slot()
        if self.static:
            env["FLASHSEND_WORKER_INSTANCE"] = f"{self.pool_id}-{slot}"
        if self.probes:
            env["FLASHSEND_METRICS_PORT"] = "-1"  # any free port, logged at start
        pg_name = f"flashsend-{self.role}-{self.pool_id}-{self.started}"
        env["PGAPPNAME"] = pg_name
        name = "worker" if self.role == "campaign" else f"{self.role}-worker"
        log_file = self.log_dir / f"{name}-{self.started}.log"
        log = open(log_file, "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flashsend.cli",
                "worker",
                "--loglevel",
                self.loglevel,
                "--role",
                self.role,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None,
        )
        log.close()
        self.log_files[proc.pid] = log_file
        self.pg_names[proc.pid] = pg_name
        self.started += 1
        self.procs.append(proc)
        self.slots[slot] = proc
        return proc

    def sessions_closed(self, proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> bool:
        """Wait until PostgreSQL has no session left of `proc` (ended): a statement it sent just
        before it died, a COMMIT included, runs to its end on the server after the process is
        gone. False after `timeout_s`, or at once when PostgreSQL does not answer."""
        name = self.pg_names.get(proc.pid)
        if name is None:
            return False
        deadline = time.monotonic() + timeout_s
        try:
            with psycopg.connect(self.settings.pg_dsn, autocommit=True, connect_timeout=2) as conn:
                while True:
                    row = conn.execute(_SESSIONS, (name,)).fetchone()
                    if row is None or row[0] == 0:
                        return True
                    if time.monotonic() >= deadline:
                        return False
                    time.sleep(0.01)
        except psycopg.OperationalError:
            return False

    def start(self, count: int) -> None:
        for _ in range(count):
            self.spawn()

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def sample_rss(self) -> float:
        for p in self.alive():
            self.max_rss_mb = max(self.max_rss_mb, rss_mb(p.pid))
        return self.max_rss_mb

    def kill(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        if pid_alive(proc.pid):
            os.kill(proc.pid, sig)
        if sig == signal.SIGKILL:
            proc.wait(timeout=30)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM every worker at once (a frozen one is continued first, or it would sit on
        the signal until the SIGKILL `timeout` later), then wait for each."""
        live = self.alive()
        for p in live:
            for sig in (signal.SIGCONT, signal.SIGTERM):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, sig)
        for p in live:
            terminate(p.pid, timeout=timeout)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)

    def ready(self, proc: subprocess.Popen[bytes]) -> bool:
        """The worker's /readyz answers 200 (joined its group, first seek done, its stores
        answer), as a scheduler's readiness probe asks; False until it serves its probes."""
        import urllib.error
        import urllib.request

        port = self._probe_port(proc)
        if port is None or proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def _probe_port(self, proc: subprocess.Popen[bytes]) -> int | None:
        port = self.probe_ports.get(proc.pid)
        log_file = self.log_files.get(proc.pid)
        if port is None and self.probes and log_file is not None:
            try:
                match = _PROBE_PORT.search(log_file.read_bytes()[:64_000])
            except OSError:
                match = None
            if match is not None:
                port = self.probe_ports[proc.pid] = int(match.group(1))
        return port

    def last_error(self, proc: subprocess.Popen[bytes], max_chars: int = 300) -> str | None:
        """Why a worker exited, as it said it: the last exception line of its log, else its
        last ERROR/CRITICAL record."""
        log_file = self.log_files.get(proc.pid)
        if log_file is None:
            return None
        try:
            with open(log_file, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 64_000))
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return None
        for pattern in (_EXCEPTION_LINE, _ERROR_RECORD):
            for line in reversed(lines):
                if pattern.search(line):
                    return line.strip()[:max_chars]
        return None


def wait_joined(
    settings: Settings, members: int, timeout: float = 60.0, *, group_id: str | None = None
) -> float | None:
    """Wait until the campaign workers' consumer group (or `group_id`'s) is stable with `members`
    members (each has its partitions); seconds waited, or None when that did not happen within
    `timeout` (the caller goes on: the campaign still runs, through the rebalances)."""
    import time

    from confluent_kafka import ConsumerGroupState, KafkaException

    from producers.topics import admin_client

    admin = admin_client(settings.kafka_bootstrap)
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            [future] = admin.describe_consumer_groups([group_id or settings.app_id]).values()
            group = future.result(timeout=5)
        except (KafkaException, TimeoutError):  # the future's timeout: a broker still starting
            group = None
        if (
            group is not None
            and group.state == ConsumerGroupState.STABLE
            and len(group.members) == members
        ):
            return time.monotonic() - began
        time.sleep(0.2)
    return None
