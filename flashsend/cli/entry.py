"""`flashsend`: the entry point. It builds the parser from the command groups beside it in
flashsend/cli/ (each exposes `register(subparsers)`; add new ones to registry())."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence

import psycopg

from flashsend import gc_pauses
from flashsend.errors import FlashsendError
from flashsend.unreachable import stack_hint

DESCRIPTION = """\
flashsend sends flash-sale campaigns (~1M recipients) and transactional mail through Amazon SES
with Kafka and PostgreSQL. PostgreSQL is the source of truth; Kafka carries work.

Typical session:
  flashsend up                      start the local stack (Kafka, PostgreSQL, SES stand-in)
  flashsend users seed 100000       synthetic users
  flashsend campaign create --name sale --template flash_sale
  flashsend promo generate 1 --count 120000   (optional) unique codes as {{promo_code}}
  flashsend campaign start 1        snapshot recipients and produce them to Kafka
  flashsend worker                  run a sender (start as many as you like)
  flashsend campaign status 1       progress, rate, ETA
  flashsend demo                    all of the above in one command, with a summary

Settings come from FLASHSEND_* environment variables (docs/settings.md).
Every command's --help: docs/cli.md.
"""


Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def registry() -> list[Register]:
    from flashsend.cli import (
        api,
        aws,
        bench,
        campaign,
        control,
        demo,
        docs,
        events,
        feedback,
        mail,
        operations,
        promo,
        push,
        resend,
        schemas,
        stack,
        worker,
    )

    return [
        stack.register,
        campaign.register,
        control.register,
        worker.register,
        demo.register,
        bench.register,
        mail.register,
        feedback.register,  # webhook, feedback status|bench|e2e|outage
        events.register,  # events pull (the SQS ingest path)
        aws.register,  # aws plan|apply
        schemas.register,
        operations.register,  # after control: adds `dlq show|replay`
        resend.register,  # after control: adds `campaign resend-unknown`
        promo.register,
        push.register,  # push setup|register
        api.register,  # api, api-key, audience, audit
        lambda sub: docs.register(sub, build_parser),  # docs cli: docs/cli.md from this parser
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flashsend",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in registry():
        register(sub)
    return parser


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "worker":
        # SIGTERM (timeout, kill) must run the `finally` blocks that stop spawned workers.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        result = args.func(args)
    except FlashsendError as exc:
        print(f"flashsend: error: {exc}", file=sys.stderr)
        return 2
    except psycopg.Error as exc:
        hint = stack_hint(exc)
        if hint is None:
            raise
        print(f"flashsend: error: {hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("flashsend: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


def run() -> int:
    """The `flashsend` program: `main` in a process of its own.

    Only a process of its own gets the collector callback (workers, webhook, puller: no long
    stop-the-world pauses mid-call): frozen objects are invisible to `gc.get_referrers`, so a
    host that calls `main` in-process, such as a test run, keeps its collector as it was.
    """
    gc_pauses.install()
    return main()
