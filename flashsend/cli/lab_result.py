"""How the lab's long runs report on the command line: progress lines unless `--json`, then
the result as JSON (one line with `--json`, indented without)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

Log = Callable[[str], None]


def _silent(_line: str) -> None:
    return None


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def progress_log(args: argparse.Namespace) -> Log:
    """Where a long run's progress lines go: stdout, or stderr with `--json`, so that stdout
    holds the JSON alone (`flashsend demo --json | jq .sent`)."""
    return _to_stderr if args.json else print


def print_result(args: argparse.Namespace, result: dict[str, Any], width: int) -> None:
    """The result as one JSON line with `--json`, else a `key value` line each."""
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"  {key:<{width}} {value}")


def run_and_print(
    args: argparse.Namespace,
    run: Callable[[Log], dict[str, Any]],
    *,
    exit_on_ok: bool = False,
    interruptible: bool = False,
) -> int:
    """Run `run(log)`, print its result and return the exit code: 1 when `exit_on_ok` and the
    result's `ok` is false, else 0. `interruptible` turns SIGTERM into Ctrl-C for runs that
    clean up and still print their JSON when interrupted."""
    log: Log = _silent if args.json else print
    if interruptible:
        from flashsend.lab.run import sigterm_interrupts

        with sigterm_interrupts():
            result = run(log)
    else:
        result = run(log)
    print(json.dumps(result, indent=None if args.json else 2))
    return 1 if exit_on_ok and not result.get("ok") else 0
