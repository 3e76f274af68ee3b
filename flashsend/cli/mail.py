"""Transactional mail: `flashsend orders …` (the demo order service),
`flashsend mail status|resend|bench`, `flashsend relay`."""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from decimal import Decimal
from typing import Any

import psycopg

from flashsend.cli.lab_result import run_and_print
from flashsend.errors import UsageError
from flashsend.settings import load_settings
from infra.orders_db import ensure_orders_db


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    orders = sub.add_parser("orders", help="the demo order service (its own database)")
    osub = orders.add_subparsers(dest="orders_cmd", required=True, metavar="ACTION")
    p = osub.add_parser("init", help="create the order database and apply its migrations")
    p.add_argument(
        "--monolith",
        action="store_true",
        help="also add the order tables to flashsend's database (monolith mode)",
    )
    p.set_defaults(func=cmd_orders_init)
    p = osub.add_parser("place", help="place an order: order + OrderConfirmed in one transaction")
    p.add_argument("--email", required=True)
    p.add_argument("--name", default=None)
    p.add_argument("--total", default="0")
    p.add_argument("--currency", default="VND")
    p.add_argument("--items", default="[]", help='JSON: [{"sku","name","quantity","price"}]')
    p.add_argument(
        "--send-after-s",
        type=float,
        default=None,
        help="hold the confirmation mail for this many seconds (delayed mail)",
    )
    p.add_argument("--template", default=None)
    p.add_argument(
        "--monolith",
        action="store_true",
        help="write the mail row in the same transaction (flashsend's database)",
    )
    p.set_defaults(func=cmd_orders_place)
    p = osub.add_parser("cancel", help="cancel an order (the mail outcome arrives later)")
    p.add_argument("id", type=int)
    p.add_argument("--reason", default=None)
    p.add_argument("--monolith", action="store_true")
    p.set_defaults(func=cmd_orders_cancel)
    p = osub.add_parser("show", help="an order and what the mail service reported about it")
    p.add_argument("id", type=int)
    p.set_defaults(func=cmd_orders_show)

    mail = sub.add_parser("mail", help="transactional mail: status, resend, latency bench")
    msub = mail.add_subparsers(dest="mail_cmd", required=True, metavar="ACTION")
    p = msub.add_parser(
        "status",
        help='"why didn\'t I get my mail?" for one dedupe key; without one, an overview',
        description="With a dedupe key: that mail's row, its resends, and any confirmation for "
        "the key that arrived older than FLASHSEND_MAIL_EVENT_MAX_AGE_S (recorded, not mailed). "
        "Without one: mail rows by status and the stale confirmations of the last day.",
        epilog="examples:\n  flashsend mail status order-confirmed:42\n"
        "  flashsend mail status --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dedupe_key", nargs="?", default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_mail_status)
    p = msub.add_parser("resend", help="send again safely, under a new dedupe key")
    p.add_argument("dedupe_key")
    p.set_defaults(func=cmd_mail_resend)
    p = msub.add_parser(
        "bench", help="order commit -> SES accepted latency under a running campaign"
    )
    p.add_argument("--orders", type=int, default=300)
    p.add_argument("--order-rate", type=float, default=10.0)
    p.add_argument("--campaign-rate", type=float, default=600.0)
    p.add_argument("--users", type=int, default=40_000)
    p.add_argument("--campaign-workers", type=int, default=1)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_mail_bench)

    p = sub.add_parser("relay", help="publish the order service's outbox to order.events")
    p.add_argument(
        "--outbox",
        choices=("orders", "mail"),
        default="orders",
        help="orders: the order service's outbox; mail: the mail service's "
        "(mail workers already run that one)",
    )
    p.add_argument("--once", action="store_true", help="one batch, then exit")
    p.set_defaults(func=cmd_relay)


# ---- order database ------------------------------------------------------------------------


def cmd_orders_init(args: argparse.Namespace) -> int:
    from producers.mail_topics import ensure_mail_topics

    settings = load_settings()
    ensure_orders_db(settings, monolith=args.monolith)
    ensure_mail_topics(settings)
    print(f"order database ready: {settings.orders_database}")
    return 0


def cmd_orders_place(args: argparse.Namespace) -> int:
    import time

    from sinks.order_store import NewOrder, place_order, place_order_monolith

    settings = load_settings()
    try:
        items = json.loads(args.items)
    except ValueError as exc:
        raise UsageError(f"--items is not JSON: {exc}") from None
    order = NewOrder(
        email=args.email,
        customer_name=args.name,
        total=Decimal(args.total),
        currency=args.currency,
        items=items,
        send_after_ms=int((time.time() + args.send_after_s) * 1000) if args.send_after_s else None,
        template=args.template,
    )
    if args.monolith:
        with psycopg.connect(settings.pg_dsn) as conn, conn.transaction():
            order_id, mail = place_order_monolith(conn, order)
        print(
            json.dumps(
                {"order_id": order_id, "dedupe_key": mail.dedupe_key, "mail_created": mail.created}
            )
        )
        return 0
    with psycopg.connect(ensure_orders_db(settings)) as conn, conn.transaction():
        placed = place_order(conn, order, topic=settings.topic_order_events)
    print(
        json.dumps(
            {
                "order_id": placed.order_id,
                "event_id": placed.event_id,
                "dedupe_key": placed.dedupe_key,
            }
        )
    )
    return 0


def cmd_orders_cancel(args: argparse.Namespace) -> int:
    from sinks.order_store import cancel_order, cancel_order_monolith

    settings = load_settings()
    if args.monolith:
        with psycopg.connect(settings.pg_dsn) as conn, conn.transaction():
            results = cancel_order_monolith(conn, args.id)
        if results is None:
            raise UsageError(f"order {args.id} is not confirmed (already cancelled?)")
        print(json.dumps({"order_id": args.id, "mails": {k: str(r) for k, r in results}}))
        return 0
    with psycopg.connect(settings.orders_pg_dsn) as conn, conn.transaction():
        event_id = cancel_order(
            conn, args.id, topic=settings.topic_order_events, reason=args.reason
        )
    if event_id is None:
        raise UsageError(f"order {args.id} is not confirmed (already cancelled?)")
    # Seed cancel trap 6: the order is cancelled; whether its mail was stopped in time is
    # decided by the mail service and reported later (EmailCancelled / EmailCancelTooLate).
    print(
        json.dumps(
            {
                "order_id": args.id,
                "event_id": event_id,
                "mail": "outcome pending: see `flashsend orders show`",
            }
        )
    )
    return 0


def cmd_orders_show(args: argparse.Namespace) -> int:
    from sinks.order_store import order_with_emails

    settings = load_settings()
    with psycopg.connect(settings.orders_pg_dsn) as conn:
        print(json.dumps(order_with_emails(conn, args.id), default=str, indent=2))
    return 0


# ---- mail ----------------------------------------------------------------------------------


def cmd_mail_status(args: argparse.Namespace) -> int:
    from sinks.mail_enqueue import mail_overview, mail_status

    settings = load_settings()
    with psycopg.connect(settings.pg_dsn) as conn:
        row = mail_overview(conn) if args.dedupe_key is None else mail_status(conn, args.dedupe_key)
    if args.json:
        print(json.dumps(row, default=str, indent=2))
    elif args.dedupe_key is None:
        print(format_overview(row, settings.mail_event_max_age_s))
    else:
        print(format_status(row, settings.mail_event_max_age_s))
    return 0


def format_overview(row: dict[str, Any], max_age_s: float) -> str:
    by_status = row["by_status"] or {}
    counts = "  ".join(f"{k} {v}" for k, v in sorted(by_status.items())) or "none"
    return "\n".join(
        [
            f"mail rows: {counts}",
            f"stale confirmations (older than {max_age_s:g}s, no mail): "
            f"{row['stale_last_day']} in the last day, {row['stale_total']} kept"
            + (f", latest {row['last_stale_at']}" if row["last_stale_at"] else ""),
        ]
    )


def format_stale(events: list[dict[str, Any]], max_age_s: float) -> list[str]:
    return [
        f"  stale {e['event_type']} {e['event_id']}: occurred {e['occurred_at']}, arrived "
        f"{e['age_s']:.0f}s later (> {max_age_s:g}s): not mailed"
        for e in events
    ]


def format_status(row: dict[str, Any], max_age_s: float = 0.0) -> str:
    if row["status"] == "stale":
        return "\n".join(
            [
                f"{row['dedupe_key']}: no mail: every event for it arrived too old to act on",
                *format_stale(row["stale_events"], max_age_s),
            ]
        )
    lines = [
        f"{row['dedupe_key']}: {row['status']}"
        + (" (tombstone: cancelled before it was created)" if row["tombstone"] else "")
        + (" (cancel requested)" if row["cancel_requested"] and not row["tombstone"] else ""),
        f"  to {row['to_email']}  template {row['template']}  delivery {row['delivery']}",
        f"  attempts {row['attempts']}  send errors {row['send_errors']}  "
        f"provider id {row['provider_id']}",
        f"  created {row['created_at']}  send after {row['send_after']}  sent {row['sent_at']}",
    ]
    if row["last_error"]:
        lines.append(f"  last error: {row['last_error']}")
    if row["status"] == "unknown":
        lines.append(
            "  unknown: SES may or may not have sent it; check SES events for the "
            "provider id / X-Flashsend-Dedupe-Key, then `flashsend mail resend` if not"
        )
    for rel in row["related"]:
        lines.append(f"  related {rel['dedupe_key']}: {rel['status']}")
    lines += format_stale(row.get("stale_events") or [], max_age_s)
    return "\n".join(lines)


def cmd_mail_resend(args: argparse.Namespace) -> int:
    from sinks.mail_enqueue import resend_mail

    settings = load_settings()
    with psycopg.connect(settings.pg_dsn) as conn, conn.transaction():
        result = resend_mail(conn, args.dedupe_key)
    print(json.dumps({"dedupe_key": result.dedupe_key, "created": result.created}))
    return 0


def cmd_mail_bench(args: argparse.Namespace) -> int:
    from flashsend.lab.mail_bench import BenchOptions, run_bench

    settings = load_settings()
    options = BenchOptions(
        orders=args.orders,
        order_rate=args.order_rate,
        campaign_rate=args.campaign_rate,
        users=args.users,
        campaign_workers=args.campaign_workers,
    )
    return run_and_print(args, lambda log: run_bench(settings, options, log=log))


# ---- relay ---------------------------------------------------------------------------------


def cmd_relay(args: argparse.Namespace) -> int:
    from flashsend.logs import configure
    from producers.mail_topics import ensure_mail_topics
    from producers.outbox_relay import OutboxRelay
    from streams.mail_app import relay_config

    settings = load_settings()
    configure(settings.log_format, "info")  # FLASHSEND_LOG_FORMAT=json: one JSON object a line
    ensure_mail_topics(settings)
    if args.outbox == "orders":
        relay = OutboxRelay(ensure_orders_db(settings), relay_config(settings, "outbox", "outbox"))
    else:
        relay = OutboxRelay(settings.pg_dsn, relay_config(settings, "mail_outbox", None))
    if args.once:
        if not relay.acquire():
            print("another relay holds the lock")
            return 1
        print(json.dumps(relay.run_once().__dict__))
        relay.close()
        return 0
    from flashsend import health
    from sinks import metrics_state  # /metrics and probes of the relay

    metrics_state.start(settings, "relay" if args.outbox == "orders" else "mail")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        relay.run(stop, on_loop=lambda: health.PROBE.beat(time.monotonic()))
    except KeyboardInterrupt:
        stop.set()
    return 0
