"""Launch the SES stand-in as a real subprocess for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from infra.ses_standin.admin import SesStandinAdmin

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A port that was free a moment ago (bind to port 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class StandinProcess:
    """A running `python -m infra.ses_standin`."""

    process: subprocess.Popen[bytes]
    url: str
    state_dir: Path
    log_path: Path
    admin: SesStandinAdmin

    def client(self, read_timeout: float = 10.0, validate: bool = True) -> Any:
        """The real boto3 sesv2 client pointed at the stand-in, SDK retries off.

        `retries={"max_attempts": 1}` would NOT turn retries off: in a client Config,
        botocore reads `max_attempts` as *retries* (total = max_attempts + 1). Only
        `total_max_attempts: 1` (or `max_attempts: 0`) means exactly one attempt.
        """
        return boto3.client(
            "sesv2",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="x",
            config=Config(
                retries={"total_max_attempts": 1, "mode": "standard"},
                read_timeout=read_timeout,
                connect_timeout=5,
                parameter_validation=validate,
            ),
        )

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit within 5 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def start_standin(
    state_dir: Path, *extra_args: str, port: int | None = None, ready_timeout: float = 15.0
) -> StandinProcess:
    """Start the stand-in on `port` (default: a free one) and wait until it answers."""
    port = port or free_port()
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir.parent / f"{state_dir.name}-standin-{port}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "infra.ses_standin",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--state-dir",
                str(state_dir),
                *extra_args,
            ],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    standin = StandinProcess(process, url, state_dir, log_path, SesStandinAdmin(url))
    deadline = time.monotonic() + ready_timeout
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            standin.stop()
            raise RuntimeError(f"SES stand-in did not start:\n{standin.log()}")
        try:
            standin.admin.wait_ready(0.25)
            return standin
        except TimeoutError:
            continue
