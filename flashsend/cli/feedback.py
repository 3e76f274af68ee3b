"""`flashsend webhook`, `flashsend feedback status|subscribe|bench|e2e` (deliverability).

See docs/deliverability.md.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from flashsend.cli.lab_result import run_and_print
from flashsend.lab.sns_load import CONCURRENCY, FIREHOSE_BATCH
from flashsend.settings import load_settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "webhook",
        help="run the deliverability webhook: SNS events in, RFC 8058 one-click unsubscribe",
        description="POST /sns receives SES events through SNS (signatures verified, events "
        "published as Avro on mail.events, 200 only after the broker's ack); GET/POST "
        "/u/TOKEN is the List-Unsubscribe target. `flashsend up` starts one on "
        "FLASHSEND_WEBHOOK_PORT and subscribes it at the local SES stand-in. "
        "With --processes N (default FLASHSEND_WEBHOOK_PROCESSES, or half the CPUs: 1 on a "
        "2-core machine), N processes answer on the one port (SO_REUSEPORT); one process "
        "ingests on about one core.",
        epilog="examples:\n  flashsend webhook\n  flashsend webhook --processes 4 --port 8443"
        "\n  flashsend webhook --processes 1   # one process, e.g. under a process manager",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=None, help="default FLASHSEND_WEBHOOK_PORT (14567)")
    p.add_argument(
        "--processes",
        type=int,
        default=None,
        help="webhook processes sharing the port (default FLASHSEND_WEBHOOK_PROCESSES; "
        "0 or unset: half the CPUs, at least 1)",
    )
    p.add_argument("--loglevel", default="info", help="default %(default)s")
    # Set by the supervisor of --processes N for its children.
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-relay", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_webhook)

    fb = sub.add_parser("feedback", help="bounces, complaints, unsubscribes: status and checks")
    fsub = fb.add_subparsers(dest="feedback_cmd", required=True, metavar="ACTION")
    p = fsub.add_parser("status", help="a campaign's feedback counters and automatic pause")
    p.add_argument("id", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = fsub.add_parser(
        "subscribe",
        help="subscribe the webhook to the local SES stand-in's event topic (flashsend up "
        "does it); waits for the confirmation",
    )
    p.add_argument("--endpoint", default=None, help="default: FLASHSEND_WEBHOOK_PUBLIC_URL/sns")
    p.set_defaults(func=cmd_subscribe)

    p = fsub.add_parser(
        "bench",
        help="measure ingest (events/s and CPU µs per event per path) and the delay "
        "complaint → campaign paused",
        description="Runs its own webhook (and a feedback worker) against the current stack's "
        "Kafka and PostgreSQL, in a scratch database and topics, and POSTs notifications it "
        "signed in advance (the SES stand-in is not involved); then POSTs batches of SES events "
        "to its /firehose as an Amazon Data Firehose delivery stream does; then fills an SQS "
        "queue (the stack's ElasticMQ, or one started for the run) and drains it with "
        "`flashsend events pull`. Reports per ingest path (paths.webhook, paths.firehose, "
        "paths.sqs) events_per_s and "
        "cpu_us_per_event (CPU time of the ingest processes per event: the figure to compare "
        "across runs on a shared machine; the SQS server's apart), the load generator's own "
        "CPU and the machine's other load; the top-level events_per_s is the faster path's "
        "(best_path); then the feedback agent's rate and the complaint → pause delay.",
        epilog="examples:\n  flashsend feedback bench --json\n"
        "  flashsend feedback bench --agent-only --events 100000 --json\n"
        "  flashsend feedback bench --events 5000 --processes 1 --ingest-only\n"
        "  flashsend feedback bench --events 10000 --pullers 16 --ingest-only --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--events", type=int, default=20_000, help="notifications to POST (default %(default)s)"
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        help="connections, one POST in flight each, as SNS does; SNS opens as many as its "
        "delivery rate needs, and fewer leave the webhook idle between answers "
        "(default %(default)s)",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=None,
        help="webhook processes (default: FLASHSEND_WEBHOOK_PROCESSES when set, else one per "
        "CPU; `flashsend webhook` runs half the CPUs beside the rest of the stack)",
    )
    p.add_argument(
        "--pauses", type=int, default=5, help="complaint → pause measurements (default %(default)s)"
    )
    p.add_argument(
        "--ingest-only",
        action="store_true",
        help="measure the ingest path only (no feedback worker, no pause delays)",
    )
    p.add_argument(
        "--agent-only",
        action="store_true",
        help="measure the feedback agent alone: a backlog of --events records of one sending "
        "campaign produced straight onto mail.events (no webhook), then one feedback worker; "
        "events/s and CPU µs per event from its first stored offset to the last "
        "(flashsend/lab/feedback_agent_bench.py)",
    )
    p.add_argument(
        "--no-sqs", action="store_true", help="skip the SQS path (SQS → `flashsend events pull`)"
    )
    p.add_argument(
        "--pullers",
        type=int,
        default=8,
        help="concurrent long polls of the SQS path's puller (default %(default)s)",
    )
    p.add_argument(
        "--no-firehose",
        action="store_true",
        help="skip the Firehose path (batches POSTed to the webhook's /firehose)",
    )
    p.add_argument(
        "--firehose-batch",
        type=int,
        default=FIREHOSE_BATCH,
        help="SES events per Firehose request (default %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="one JSON line on stdout")
    p.set_defaults(func=cmd_bench)

    p = fsub.add_parser(
        "e2e",
        help="a campaign with injected hard bounces and complaints pauses itself, its "
        "bounced/complained addresses are suppressed, a second campaign skips them",
        description="Uses the running stack (SES stand-in included) with a scratch database, "
        "topics and configuration set; starts its own webhook, campaign and feedback workers. "
        "Reports seconds_from_crossing_to_pause: from the arrival at the webhook of the event "
        "after which the campaign's counters cross the complaint threshold (the stand-in's "
        "emission of it) to the campaign's pause; crossing.seconds_to_applied is when the agent "
        "applied that event (even if the campaign had already finished), "
        "crossing.standin_queue_s how long the event waited in the stand-in before its POST.",
        epilog="examples:\n  flashsend feedback e2e --json\n"
        "  flashsend feedback e2e --rate 0 --json\n"
        "  flashsend feedback e2e --rate 0 --sender-nice 10 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--users", type=int, default=50_000, help="default %(default)s")
    p.add_argument(
        "--rate",
        type=float,
        default=300.0,
        help="campaign rate (recipients/s, default %(default)s; 0 = as fast as it goes); the "
        "feedback loop must keep up with it on this machine",
    )
    p.add_argument("--complaints", type=float, default=0.003, help="share of complainers")
    p.add_argument("--bounces", type=float, default=0.02, help="share of hard bounces")
    p.add_argument("--min-sample", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=2, help="campaign worker processes")
    p.add_argument(
        "--sender-nice",
        type=int,
        default=0,
        help="niceness added to the campaign workers (default 0): the SES stand-in plays AWS, "
        "whose CPU is not ours in production; on a small machine unthrottled senders starve "
        "its event emitter and the campaign ends before the events exist",
    )
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_e2e)


def cmd_webhook(args: argparse.Namespace) -> int:
    from flashsend import deliverability
    from producers.webhook import run_webhook

    settings = load_settings()
    processes = (
        deliverability.webhook_processes(settings) if args.processes is None else args.processes
    )
    if processes < 1:
        raise SystemExit("flashsend webhook: --processes must be at least 1")
    return run_webhook(
        settings,
        args.host,
        args.port or settings.webhook_port,
        args.loglevel,
        processes=processes,
        reuse_port=args.reuse_port,
        relay=not args.no_relay,
    )


def cmd_status(args: argparse.Namespace) -> int:
    import psycopg
    from psycopg.rows import dict_row

    from flashsend.errors import NotFound
    from sinks.queries import query

    settings = load_settings()
    with psycopg.connect(settings.pg_dsn, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute(query("campaign_feedback"), {"campaign_id": args.id}).fetchone()
    if row is None:
        raise NotFound(f"no feedback recorded for campaign {args.id}")
    out: dict[str, Any] = {
        k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()
    }
    if args.json:
        print(json.dumps(out))
        return 0
    base = max(out["sent"], out["delivered"] + out["bounced"]) or 1
    why = f" ({out['reason']})" if out["reason"] else ""
    print(
        f"campaign {args.id}: {out['status']}{why}\n"
        f"  sent {out['sent']:,}  delivered {out['delivered']:,}  hard bounces {out['bounced']:,} "
        f"({out['bounced'] / base:.2%})  complaints {out['complained']:,} "
        f"({out['complained'] / base:.3%})  soft bounces {out['soft_bounced']:,}  "
        f"unsubscribed {out['unsubscribed']:,}"
    )
    return 0


def cmd_subscribe(args: argparse.Namespace) -> int:
    from infra.webhook_service import subscribe_local

    sub = subscribe_local(load_settings(), endpoint=args.endpoint)
    print(f"subscribed {sub['endpoint']} to {sub['topic_arn']}: {sub['status']}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from flashsend.lab.feedback_bench import BenchOptions, run_bench

    if args.agent_only:
        from flashsend.lab.feedback_agent_bench import run_agent_bench

        return run_and_print(args, lambda log: run_agent_bench(load_settings(), args.events, log))

    options = BenchOptions(
        events=args.events,
        concurrency=args.concurrency,
        pauses=args.pauses,
        processes=args.processes,
        agent=not args.ingest_only,
        sqs=not args.no_sqs,
        pullers=args.pullers,
        firehose=not args.no_firehose,
        firehose_batch=args.firehose_batch,
    )
    return run_and_print(args, lambda log: run_bench(load_settings(), options, log=log))


def cmd_e2e(args: argparse.Namespace) -> int:
    from flashsend.lab.feedback_e2e import E2eOptions, run_e2e_scratch

    options = E2eOptions(
        users=args.users,
        rate=args.rate,
        p_complaint=args.complaints,
        p_bounce=args.bounces,
        min_sample=args.min_sample,
        workers=args.workers,
        timeout_s=args.timeout,
        sender_nice=args.sender_nice,
    )
    return run_and_print(
        args,
        lambda log: run_e2e_scratch(load_settings(), options, log=log),
        exit_on_ok=True,
        interruptible=True,
    )
