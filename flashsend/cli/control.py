"""`flashsend campaign reconcile|report`, `flashsend dlq list`, `flashsend chaos`."""

from __future__ import annotations

import argparse
import json
import textwrap
from typing import Any

import psycopg

from flashsend.cli.campaign import format_limit, format_slots, format_variants
from flashsend.cli.lab_result import print_result, progress_log
from flashsend.errors import UsageError
from flashsend.settings import load_settings
from sinks.campaign_views import report_view


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    camp = sub.choices["campaign"]
    csub = next(a for a in camp._actions if isinstance(a, argparse._SubParsersAction))
    p = csub.add_parser(
        "reconcile",
        help="expired leases → unknown, released or lost rows → "
        "produced again, finished → done (safe any time, concurrently)",
    )
    p.add_argument("id", type=int)
    p.add_argument(
        "--lease",
        type=float,
        default=None,
        help="seconds after which a 'sending' row becomes unknown (default FLASHSEND_LEASE_S)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_reconcile)

    p = csub.add_parser(
        "report",
        help="final counts per status and reason, timings, rate over time",
        description="Also `in_doubt`: rows settled by SES events against rows still unknown, "
        "and rows queued again by resend-unknown. Needs the campaign's rows: run it before "
        "`campaign retire`.",
    )
    p.add_argument("id", type=int, help="campaign id")
    p.add_argument("--bucket", type=float, default=10.0, help="seconds per rate bucket")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_report)

    dlq = sub.add_parser("dlq", help="dead letters (records that could not be processed)")
    dsub = dlq.add_subparsers(dest="dlq_cmd", required=True)
    p = dsub.add_parser("list", help="show dead letters with their reason and origin")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_dlq_list)

    p = sub.add_parser(
        "chaos",
        help="run a campaign while killing workers and restarting the broker/Postgres; "
        "check that nothing is lost and nobody is mailed twice",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Needs the local stack (`flashsend up`, or `FLASHSEND_KAFKA_BROKERS=3 flashsend "
            "up` for a cluster; run chaos with the same FLASHSEND_KAFKA_BROKERS): it stops and "
            "starts the Kafka nodes and PostgreSQL itself. Prints one JSON object as the last "
            "line with --json, also when the run fails or is interrupted (Ctrl-C, SIGTERM): "
            "then with an `error` field, the broker and PostgreSQL started again and the "
            "campaign cancelled if unfinished. With the event loop (default) it also reports "
            "the rows in doubt: unknown_resolved (settled from unknown by an SES event), "
            "resolved_before_answer, unknown_accepted_by_ses / unknown_never_accepted (rows "
            "that are or were unknown, looked up at the stand-in), unknown_accepted_unresolved "
            "(must be 0) and unknown_at_end (before the events).",
            width=79,
        )
        + "\n\n"
        + textwrap.fill(
            "Faults combine: kills go on during restarts, the frozen worker may be killed; "
            "docs/operations.md (Chaos runs) has each flag. The JSON: duplicates, lost, "
            "rolling_restarts, broker_kills and broker_killed (accepted_while_down: "
            "recipients SES accepted while the node was down), in_flight_at_kills (rows in a "
            "call right after each kill, the freeze, a worker's own exit and the PostgreSQL "
            "stop: the only rows a fault can leave in doubt), unknown_outside_in_flight (0 "
            "for invariants_ok), unknown_bound, invariants_ok with invariants (each check by "
            "name) and invariants_failed, worker_exits (why a worker died by itself), "
            "cpu_us_per_recipient_flashsend (workers, webhook and feedback worker; not the "
            "broker, PostgreSQL or stand-in), events_emission (what the stand-in did with the "
            "run's events). --rolling-restart-every sends SIGTERM to each worker in turn (it "
            "drains, a replacement starts); no SIGKILL unless --kill-every is given.",
            width=79,
        )
        + "\n\nExamples:\n"
        "  flashsend chaos --users 20000 --workers 2 --kill-every 5 --restart-postgres-at 10 "
        "--zombie-at 4 --json\n"
        "  flashsend chaos --users 200000 --workers 3 --rolling-restart-every 5 --json\n"
        "  FLASHSEND_KAFKA_BROKERS=3 flashsend chaos --users 200000 --workers 3 --kill-every 10 "
        "--kill-broker-at 15 --json",
    )
    p.add_argument(
        "--users", type=int, default=200_000, help="users to seed (default: %(default)s)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=3,
        help="workers kept running; a killed one is replaced (default: %(default)s)",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="campaign rate in recipients/s, 0 = unlimited (default: %(default)s)",
    )
    p.add_argument(
        "--kill-every",
        type=float,
        default=None,
        metavar="S",
        help="SIGKILL a worker every S s, 0 = never (default: 5, or 0 with "
        "--rolling-restart-every)",
    )
    p.add_argument(
        "--rolling-restart-every",
        type=float,
        default=0.0,
        metavar="S",
        help="every S s, SIGTERM the next worker in turn (the one running longest), wait for it "
        "to drain and exit, start a replacement; one at a time, and only once every live "
        "worker's /readyz answers; JSON: rolling_restarts, drains (seconds from SIGTERM to "
        "exit, each), drain_s_max (default: off)",
    )
    p.add_argument(
        "--restart-broker-at",
        type=float,
        default=None,
        metavar="T",
        help="stop every Kafka node at T s into the run, start them again 3 s later",
    )
    p.add_argument(
        "--kill-broker-at",
        type=float,
        default=None,
        metavar="T",
        help="at T s, SIGKILL the Kafka node leading the most campaign.recipients partitions "
        "(from the cluster's metadata then) and start it again after --broker-down-s; on one "
        "broker every partition stops meanwhile; JSON: broker_kills, broker_killed (node, "
        "partitions_led, leaders_moved: of those, led by another node just before it came "
        "back, accepted_while_down: recipients SES accepted for the campaign while it was "
        "down, down_s)",
    )
    p.add_argument(
        "--broker-down-s",
        type=float,
        default=None,
        metavar="S",
        help="how long the killed Kafka node stays down (default: 15: past the controller's "
        "9-s broker session timeout, so the partitions it led get new leaders meanwhile)",
    )
    p.add_argument("--restart-postgres-at", type=float, default=None, help="seconds into the run")
    p.add_argument(
        "--zombie-at",
        type=float,
        default=None,
        help="SIGSTOP a worker at T s, SIGCONT it after the rebalance",
    )
    p.add_argument(
        "--ses-hang-rate",
        type=float,
        default=0.0,
        help="probability that the stand-in accepts a call and never answers",
    )
    p.add_argument(
        "--lease",
        type=float,
        default=20.0,
        help="seconds after which a killed worker's 'sending' rows become unknown "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="give up if the campaign is not finished by then (default: %(default)s)",
    )
    p.add_argument(
        "--events-wait",
        type=float,
        default=30.0,
        metavar="S",
        help="run the event loop (a webhook process and a feedback worker: SES's events settle "
        "rows in doubt); after the run, wait for the events of every unknown row the stand-in "
        "accepted, giving up after S s without progress (of the feedback worker, or of the "
        "stand-in's deliveries to the webhook: its backlog drains meanwhile; at most 40 x S in "
        "all); 0 = no event loop (default: %(default)s)",
    )
    p.add_argument(
        "--promo-codes",
        action="store_true",
        help="give the campaign a promo pool ({{promo_code}} in its template) and add the "
        "invariant promo_codes_unique: each code to one recipient and one address, one code "
        "per recipient, nothing sent without one (read from our rows and at the stand-in)",
    )
    p.add_argument(
        "--channel",
        choices=("email", "sms", "push"),
        default="email",
        help="sms: the campaign texts users' phones (one SendTextMessage each); there are no "
        "SMS events to settle unknown rows, so no event loop (--events-wait is ignored). "
        "push: one SNS Publish per device endpoint of each user (0-3 each); no event loop "
        "either; duplicates are counted per device. "
        "Example: flashsend chaos --channel sms --users 50000 --workers 3 --kill-every 5 --json",
    )
    p.add_argument("--json", action="store_true", help="one JSON object on the last line of stdout")
    p.set_defaults(func=cmd_chaos)


def cmd_reconcile(args: argparse.Namespace) -> int:
    from producers.reconcile import Reconciler

    with Reconciler(load_settings()) as reconciler:
        result = reconciler.reconcile(args.id, lease_s=args.lease)
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(
            f"campaign {args.id}: {result.expired} lease(s) expired → unknown, "
            f"{result.requeued} released and {result.orphans} orphaned row(s) produced again"
            f"{', campaign done' if result.done else ''}"
            f"{' (another reconcile was running; nothing done)' if result.skipped_locked else ''}"
        )
    return 0


def campaign_report(
    conn: psycopg.Connection[Any], campaign_id: int, bucket_s: float = 10.0
) -> dict[str, Any]:
    return report_view(conn, campaign_id, bucket_s)


def cmd_report(args: argparse.Namespace) -> int:
    settings = load_settings()
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        report = campaign_report(conn, args.id, args.bucket)
    if args.json:
        print(json.dumps(report, default=str))
        return 0
    c = report["campaign"]
    print(f"campaign {c['id']} {c['name']!r}: {c['status']}  recipients {c['recipients']}")
    print(f"  {'rate limit':<17} {format_limit(c)}")
    for key in ("started_at", "snapshot_done_at", "produced_at", "paused_at", "finished_at"):
        print(f"  {key:<17} {c[key] or '-'}")
    if report["promo_codes"] is not None:
        p = report["promo_codes"]
        print(f"  promo codes: {p['promo_codes_issued']:,} issued, {p['promo_codes_left']:,} left")
    if "ab_test" in report:
        print(format_variants(report["ab_test"]).lstrip("\n"))
    if c["correction_of"]:
        print(f"  correction of campaign {c['correction_of']} (its users with status sent)")
    if "seed_list" in report:
        sl = report["seed_list"]
        print(
            f"  seed list: {sl['seed_recipients']:,} address(es), audience held until "
            f"{sl['hold_until']}"
            + (
                f", released {sl['released_at']} by {sl['released_by']}"
                if sl["released_at"]
                else " (not released)"
            )
        )
        for row in sl["seeds"]:
            print(f"    seed {row['email']:<40} {row['status']:<10} {row['sent_at'] or ''}")
    if "schedule" in report:
        print(format_slots(report["schedule"], limit=1_000, only_open=False).lstrip("\n"))
    print(
        "  status / reason (audience; seeds above):"
        if "seed_list" in report
        else "  status / reason:"
    )
    for row in report["by_status_reason"]:
        print(f"    {row['status']:<10} {row['reason'] or '':<40} {row['count']:>10,}")
    d = report["in_doubt"]
    print(
        f"  in doubt: {d['resolved_sent']:,} resolved sent and {d['resolved_failed']:,} failed by "
        f"SES events, {d['event_before_answer']:,} settled by an event before the call's answer, "
        f"{d['still_unknown']:,} still unknown, {d['resent']:,} queued again by resend-unknown"
    )
    print(f"  rate over time (per {args.bucket:g}s bucket):")
    for row in report["rate_over_time"]:
        print(f"    t={row['t_s']:>7.0f}s  {row['per_s']:>9,.1f}/s")
    return 0


def cmd_dlq_list(args: argparse.Namespace) -> int:
    from producers.dlq import read_dead_letters

    settings = load_settings()
    letters = read_dead_letters(settings.kafka_bootstrap, settings.topic_dlq, limit=args.limit)
    if args.json:
        print(json.dumps(letters))
        return 0
    if not letters:
        print(f"no dead letters in {settings.topic_dlq}")
    for d in letters:
        print(
            f"#{d['dlq_offset']:<6} {d['reason']:<18} from {d['topic']}[{d['partition']}]@"
            f"{d['offset']}  {d['detail'][:80]}"
        )
    return 0


def cmd_chaos(args: argparse.Namespace) -> int:
    from flashsend.lab.chaos import ChaosOptions, default_kill_every, run_chaos
    from flashsend.lab.run import sigterm_interrupts

    for flag, value in (
        ("--rolling-restart-every", args.rolling_restart_every),
        ("--broker-down-s", args.broker_down_s),
        ("--kill-every", args.kill_every),
    ):
        if value is not None and value < 0:
            raise UsageError(f"{flag} must be >= 0, got {value:g}")
    options = ChaosOptions(
        users=args.users,
        workers=args.workers,
        rate=args.rate,
        kill_every_s=default_kill_every(args.kill_every, args.rolling_restart_every),
        rolling_restart_every_s=args.rolling_restart_every,
        restart_broker_at=args.restart_broker_at,
        kill_broker_at=args.kill_broker_at,
        **({} if args.broker_down_s is None else {"broker_down_s": args.broker_down_s}),
        restart_postgres_at=args.restart_postgres_at,
        zombie_at=args.zombie_at,
        ses_hang_rate=args.ses_hang_rate,
        lease_s=args.lease,
        timeout_s=args.timeout,
        events_wait_s=0.0 if args.channel in ("sms", "push") else args.events_wait,
        promo_codes=args.promo_codes,
        channel=args.channel,
    )
    with sigterm_interrupts():
        result = run_chaos(load_settings(), options, progress_log(args))
    print_result(args, result, 20)
    return 0 if result.get("invariants_ok") else 1
