"""A command run before `flashsend up` says in one line what to do, not a traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "FLASHSEND_PG_DSN": f"postgresql://postgres@127.0.0.1:{_closed_port()}/flashsend",
    }
    return subprocess.run(
        [sys.executable, "-m", "flashsend.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_command_without_postgresql_says_how_to_start_it() -> None:
    done = _run("campaign", "status", "1")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "flashsend up" in lines[0] and "FLASHSEND_PG_DSN" in lines[0]


def test_a_lab_run_without_postgresql_reports_the_fix_in_its_json() -> None:
    done = _run("demo", "--users", "10", "--json")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "flashsend up" in result["error"], result
