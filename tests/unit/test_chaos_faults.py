"""Chaos faults that meet each other: the frozen worker (zombie) may already be dead when its
thaw is due, because the kill schedule picked it meanwhile. Real processes, no stack needed."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from flashsend.lab.chaos import freeze, thaw
from flashsend.lab.workers import WorkerPool
from flashsend.settings import load_settings


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_thawing_a_zombie_the_kill_schedule_already_killed_does_not_crash() -> None:
    zombie = _sleeper()
    assert freeze(zombie)
    zombie.send_signal(signal.SIGKILL)  # the kill schedule picks the frozen worker
    zombie.wait(timeout=10)  # … and reaps it: its pid is gone (ProcessLookupError)
    assert thaw(zombie) is False
    assert freeze(zombie) is False


def test_thaw_continues_a_frozen_process() -> None:
    proc = _sleeper()
    try:
        assert freeze(proc)
        assert thaw(proc)
        with open(f"/proc/{proc.pid}/stat") as f:
            assert f.read().split(") ", 1)[1][:1] != "T"  # not stopped
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_worker_log_says_why_it_exited(tmp_path: Path) -> None:
    pool = WorkerPool(load_settings(state_dir=tmp_path), tmp_path)
    proc = _sleeper()
    log_file = tmp_path / "worker-0.log"
    log_file.write_text(
        "[2026-12-03 15:30:21,928] [1] [ERROR] [^---Recovery]: Crashed reason=StoreUnavailable\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "sinks.offsets.StoreUnavailable: server closed the connection unexpectedly\n"
        "[2026-12-03 15:30:22,961] [1] [CRITICAL] We experienced a crash!\n"
    )
    pool.log_files[proc.pid] = log_file
    try:
        assert pool.last_error(proc) == (
            "sinks.offsets.StoreUnavailable: server closed the connection unexpectedly"
        )
    finally:
        proc.kill()
        proc.wait(timeout=10)
