"""`flashsend aws plan` refuses, before any AWS call, what cannot work (the real CLI, run with
no AWS credentials anywhere)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TOPIC = '["arn:aws:sns:eu-west-1:123456789012:flashsend-ses-events"]'


def run(tmp_path: Path, path: str = "sqs", **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FLASHSEND_"))}
    clean.update(
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        FLASHSEND_STATE_DIR=str(tmp_path),
        FLASHSEND_SES_REGION="eu-west-1",
        FLASHSEND_SNS_TOPIC_ARNS=TOPIC,
    )
    clean.update(env)
    return subprocess.run(
        [sys.executable, "-m", "flashsend.cli", "aws", "plan", "--path", path],
        capture_output=True,
        text=True,
        env=clean,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"FLASHSEND_SES_ENDPOINT": "", "FLASHSEND_SQS_ENDPOINT": ""}, "no AWS credentials"),
        ({"FLASHSEND_SES_ENDPOINT": ""}, "both be AWS"),
        (
            {
                "FLASHSEND_SES_ENDPOINT": "",
                "FLASHSEND_SQS_ENDPOINT": "",
                "FLASHSEND_SES_REGION": "",
            },
            "no AWS Region",
        ),
        (
            {
                "FLASHSEND_SES_ENDPOINT": "",
                "FLASHSEND_SQS_ENDPOINT": "",
                "FLASHSEND_SNS_TOPIC_ARNS": '["arn:aws:sns:eu-west-1:000000000000:t"]',
            },
            "placeholder account",
        ),
    ],
)
def test_refuses_clearly(tmp_path: Path, env: dict[str, str], says: str) -> None:
    answer = run(tmp_path, **env)
    assert answer.returncode == 2, answer
    assert says in answer.stderr, answer.stderr
    assert "Traceback" not in answer.stderr


def test_the_firehose_path_refuses_the_local_access_key(tmp_path: Path) -> None:
    answer = run(tmp_path, "firehose", FLASHSEND_SES_ENDPOINT="", FLASHSEND_SQS_ENDPOINT="")
    assert answer.returncode == 2, answer
    assert answer.stderr.startswith("flashsend: error: FLASHSEND_FIREHOSE_ACCESS_KEYS still "), (
        answer.stderr
    )
    assert len(answer.stderr.splitlines()) == 1


def test_help_teaches_with_examples() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "flashsend.cli", "aws", "apply", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "examples:" in out and "flashsend aws apply --path sqs" in out
    assert "SNS is not emulated locally" in out
