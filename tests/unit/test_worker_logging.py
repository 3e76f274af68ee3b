"""A worker started with --loglevel warning must not build records for debug calls.

Faust's terminal spinner sets the root logger to DEBUG whatever the level asked for; every
botocore and aiokafka debug call then built a LogRecord (~5 % of a sending worker's CPU). Run in
a child process: the worker configures the process-wide logging tree.
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, logging
import faust
from flashsend.faust_worker import BoundedShutdownWorker
from faust.worker import Worker

cls = {cls}
app = faust.App("probe", broker="kafka://127.0.0.1:1")
worker = cls(app, loglevel="{level}", quiet=True, redirect_stdouts=False)
worker._setup_logging()
print(json.dumps({{
    "root": logging.getLevelName(logging.getLogger().level),
    "botocore_debug": logging.getLogger("botocore.hooks").isEnabledFor(logging.DEBUG),
    "handlers": [type(h).__name__ for h in logging.getLogger().handlers],
}}))
"""


def probe(cls: str, level: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(cls=cls, level=level)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_faust_own_worker_turns_debug_on_at_warning_level() -> None:
    # The trap this module guards against, checked on the installed Faust.
    assert probe("Worker", "warning")["botocore_debug"] is True


def test_our_worker_keeps_the_level_it_was_given() -> None:
    seen = probe("BoundedShutdownWorker", "warning")
    assert seen == {"root": "WARNING", "botocore_debug": False, "handlers": ["StreamHandler"]}


def test_debug_level_still_logs_debug() -> None:
    assert probe("BoundedShutdownWorker", "debug")["botocore_debug"] is True
