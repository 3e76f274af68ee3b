"""A Faust worker whose shutdown is bounded and which never outlives its launcher.

A worker that is still a group member but no longer consuming (stuck in a graceful shutdown)
holds its partitions until its session times out — and every rebalance waits for it. So:
- after SIGTERM/SIGINT, a watchdog exits the process hard after `grace_s` (rows it held are
  released by a clean stop, or become `unknown` through reconcile — never resent);
- a worker started by another process (demo, chaos, bench, tests) exits when that process
  dies, instead of sending on in the background.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from faust.worker import Worker


def _exit_after(seconds: float) -> None:
    def run() -> None:
        time.sleep(seconds)
        os._exit(0)

    threading.Thread(target=run, name="shutdown-watchdog", daemon=True).start()


def _exit_when_orphaned(parent: int, poll_s: float = 1.0) -> None:
    def run() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(0)

    threading.Thread(target=run, name="orphan-watchdog", daemon=True).start()


class BoundedShutdownWorker(Worker):  # type: ignore[misc,unused-ignore]
    def __init__(
        self, *args: Any, grace_s: float = 20.0, exit_with_parent: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        # Faust's terminal spinner advances on every log record, so with it the worker sets the
        # root logger to DEBUG whatever --loglevel says: every botocore and aiokafka debug call
        # then built a LogRecord and took a handler lock (~5 % of a sending worker's CPU,
        # py-spy, docs/decisions.md). Our workers log to files; no spinner.
        self.spinner = None
        self._grace_s = grace_s
        if exit_with_parent and os.getppid() != 1:
            _exit_when_orphaned(os.getppid())

    def _on_sigterm(self) -> None:
        _exit_after(self._grace_s)
        super()._on_sigterm()

    def _on_sigint(self) -> None:
        _exit_after(self._grace_s)
        super()._on_sigint()
