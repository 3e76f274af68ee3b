"""`flashsend worker` — one Faust worker process (run as many as you like)."""

from __future__ import annotations

import argparse
import os

from flashsend.logs import logging_config
from flashsend.settings import load_settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker",
        help="run a sender worker (Faust); start several for more partitions in parallel",
        description="Consumes campaign.recipients, claims rows in PostgreSQL with the consumer "
        "offsets in the same transaction, and calls SES SendBulkEmail with per-partition "
        "pacing. Stop with Ctrl-C / SIGTERM (unsent claimed rows are released).",
    )
    p.add_argument("--loglevel", default="warning", help="debug|info|warning|error")
    p.add_argument(
        "--role",
        choices=("campaign", "mail", "orders", "feedback"),
        default="campaign",
        help="campaign sender (default); mail: the transactional mail service; orders: the "
        "demo order service's consumer of mail.events (docs/transactional.md); feedback: SES "
        "events and unsubscribes → suppressions, counters, auto-pause (docs/deliverability.md)",
    )
    p.set_defaults(func=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    if args.role == "feedback":  # deliverability: mail.events → suppressions
        from streams.feedback_app import run_feedback_worker

        return run_feedback_worker(load_settings(), args.loglevel)
    if args.role != "campaign":  # transactional mail
        from streams.mail_app import run_role

        return run_role(load_settings(), args.role, args.loglevel)
    from flashsend.faust_worker import BoundedShutdownWorker
    from producers.campaign import ensure_campaign_topics
    from schemas.serde import check_registered
    from streams.app import create_app

    settings = load_settings()
    check_registered(settings, ("campaign_recipient",))  # before any Kafka client: one line
    ensure_campaign_topics(settings)
    (settings.state_dir / "faust").mkdir(parents=True, exist_ok=True)
    app = create_app(settings)
    worker = BoundedShutdownWorker(
        app,
        grace_s=settings.worker_shutdown_grace_s,
        exit_with_parent=settings.worker_exit_with_parent,
        loglevel=args.loglevel,
        quiet=True,
        redirect_stdouts=False,
        workdir=str(settings.state_dir / "faust"),
        logging_config=logging_config(settings.log_format, args.loglevel),
    )
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    worker.execute_from_commandline()
    return 0  # not reached: execute_from_commandline exits
