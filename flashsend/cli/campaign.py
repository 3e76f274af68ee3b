"""`flashsend campaign …`, `flashsend users seed`, `flashsend template put`."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import psycopg

from flashsend.errors import UsageError
from flashsend.progress import ProgressLine
from flashsend.settings import Settings, load_settings
from producers.campaign_ops import (
    DEFAULT_HTML,
    DEFAULT_SUBJECT,
    DEFAULT_TEMPLATE,
    DEFAULT_TEXT,
    AbTest,
    control_campaign,
    create_campaign,
)
from sinks.campaign_store import CampaignStore
from sinks.promo_store import PromoCounts, PromoStore
from sinks.variant_store import COUNTED, VariantStore, variants_summary
from streams.ab_test import WINNER_BY, check_variants, parse_duration, parse_variant


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    users = sub.add_parser("users", help="synthetic users").add_subparsers(
        dest="users_cmd", required=True
    )
    p = users.add_parser(
        "seed",
        help="add N synthetic users (some inactive, opted out, "
        "suppressed, invalid — realistic shares)",
    )
    p.add_argument("count", type=int, help="how many users to add (ids continue after the last)")
    p.set_defaults(func=cmd_users_seed)

    tmpl = sub.add_parser("template", help="SES templates").add_subparsers(
        dest="tmpl_cmd", required=True
    )
    p = tmpl.add_parser("put", help="create or update an SES template ({{var}} placeholders)")
    p.add_argument("name", nargs="?", default=DEFAULT_TEMPLATE, help="template name (%(default)s)")
    p.add_argument("--subject", default=DEFAULT_SUBJECT, help="subject line with {{var}}s")
    p.add_argument("--html", default=DEFAULT_HTML, help="HTML body with {{var}}s")
    p.add_argument("--text", default=DEFAULT_TEXT, help="plain-text body with {{var}}s")
    p.set_defaults(func=cmd_template_put)

    camp = sub.add_parser("campaign", help="create, start, watch and control campaigns")
    csub = camp.add_subparsers(dest="campaign_cmd", required=True, metavar="ACTION")
    p = csub.add_parser(
        "create",
        help="create a draft campaign (prints its id)",
        description="A/B test, then the winner: give two or more "
        "--variant NAME=TEMPLATE[:PERCENT]. Each user's variant is fixed at start by a hash "
        "of the campaign and user ids; the "
        "variants' shares (the test share) are sent first, the rest of the audience (the "
        "holdout) is held. After --holdout-wait the variant with the best click (or open) rate "
        "per delivered mail wins (a tie: the one given first) and the holdout gets its "
        "template; `campaign promote ID VARIANT` picks the winner by hand at any time before. "
        "Automatic winners need the SES Open/Click events: FLASHSEND_SES_EVENT_TYPES must "
        "include them. Example: flashsend campaign create --name sale --variant A=sale_a:10 "
        "--variant B=sale_b:10 --holdout-wait 2h --winner-by clicks. "
        "SMS: --channel sms --body TEXT texts each user's phone (users.phone, E.164 after "
        "normalising; others are skipped, invalid_phone) from FLASHSEND_SMS_ORIGINATION_IDENTITY; "
        "--rate counts messages. Example: flashsend campaign create --name sale-sms "
        "--channel sms --body 'Hi {{first_name}}, -50% today. Reply STOP to opt out' --rate 50",
    )
    p.add_argument(
        "--channel",
        choices=("email", "sms"),
        default="email",
        help="email (SES) or sms (AWS End User Messaging SMS); default %(default)s",
    )
    p.add_argument(
        "--body",
        default=None,
        help="with --channel sms: the message, {{first_name}} and {{promo_code}} filled in "
        "(GSM-7: 160 characters a segment, 153 once split; other characters: 70 / 67)",
    )
    p.add_argument("--name", required=True, help="a name for people (shown by status/report)")
    p.add_argument(
        "--template",
        default=DEFAULT_TEMPLATE,
        help="SES template to send (must exist at start: flashsend template put; "
        "default %(default)s)",
    )
    p.add_argument(
        "--from",
        dest="from_address",
        default=None,
        help="From address (default FLASHSEND_FROM_ADDRESS)",
    )
    p.add_argument(
        "--configuration-set",
        default=None,
        help="SES configuration set (default FLASHSEND_MARKETING_CONFIGURATION_SET)",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="recipients per second for the whole campaign; 0 = unlimited "
        "(default FLASHSEND_DEFAULT_RATE)",
    )
    p.add_argument(
        "--audience", default=None, help="SQL condition over users u (default: active and opted in)"
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=TEMPLATE[:PERCENT]",
        help="an A/B test variant: its SES template and share of the audience in percent "
        "(default 10); give at least two, shares adding up to at most 100",
    )
    p.add_argument(
        "--holdout-wait",
        default="2h",
        metavar="DURATION",
        help="how long after the snapshot the winner is chosen: 90s, 30m, 2h, 1h30m "
        "(default %(default)s)",
    )
    p.add_argument(
        "--winner-by",
        choices=WINNER_BY,
        default="clicks",
        help="unique clicks or opens per delivered mail, or manual (only `campaign promote`); "
        "default %(default)s",
    )
    p.set_defaults(func=cmd_create)

    p = csub.add_parser(
        "promote",
        help="make VARIANT the A/B test's winner now: the holdout gets its template",
        description="Sets the winner whatever --winner-by says (before the automatic choice; "
        "once a winner is set it stays). A sending campaign's holdout is produced before the "
        "command returns; a paused one's on resume. Safe to run twice or from two terminals: "
        "one statement sets the winner only while there is none. "
        "Example: flashsend campaign promote 42 B",
    )
    p.add_argument("id", type=int, help="campaign id")
    p.add_argument("variant", help="the variant's NAME")
    p.set_defaults(func=cmd_promote)

    p = csub.add_parser(
        "start",
        help="preflight, snapshot recipients, produce them to Kafka "
        "(starting twice produces nothing new)",
        description="The snapshot takes every user of the audience once: of users sharing an "
        "address (same after trimming and lowercasing), the lowest user id gets the mail and "
        "the others are skipped as duplicate_address; an address SES cannot take is skipped "
        "as invalid_email. Example: flashsend campaign start 42 && flashsend campaign status 42",
    )
    p.add_argument("id", type=int, help="campaign id (from campaign create)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=cmd_start)

    p = csub.add_parser(
        "status",
        help="counts per status, rate and ETA (trigger-kept counters: ~1 ms at 1M rows)",
        description="Counts per status from trigger-kept counters, and what the snapshot "
        "skipped (duplicate and invalid addresses; `campaign report` lists every reason). "
        "A campaign with a promo pool also shows its codes issued and left (counted over the "
        "pool's partial indexes). "
        "Example: flashsend campaign status 42 --watch",
    )
    p.add_argument("id", type=int, help="campaign id")
    p.add_argument("--json", action="store_true", help="print one JSON object per refresh")
    p.add_argument("--watch", action="store_true", help="refresh until the campaign is done")
    p.set_defaults(func=cmd_status)

    for action, help_text in (
        ("pause", "stop SES calls within a second"),
        ("resume", "continue a paused campaign"),
        ("cancel", "cancel every still-pending recipient"),
    ):
        p = csub.add_parser(action, help=help_text)
        p.add_argument("id", type=int, help="campaign id")
        p.add_argument(
            "--reason", default=f"operator {action}", help="recorded on the campaign (%(default)s)"
        )
        p.set_defaults(func=cmd_control, action=action)

    p = csub.add_parser(
        "retire",
        help="drop a done/cancelled/failed campaign's recipient rows (its partition); "
        "`status` keeps the final counts, `report` needs the rows: run it first",
        description="Each campaign's recipients live in a partition of their own "
        "(campaign_recipients_ID). Retiring detaches it concurrently (running campaigns keep "
        "sending) and drops it. Only done, cancelled or failed campaigns; without --yes it "
        "only says what it would drop. Example: flashsend campaign report 42 --json > "
        "42.json && flashsend campaign retire 42 --yes",
    )
    p.add_argument("id", type=int, help="campaign id")
    p.add_argument("--yes", action="store_true", help="really drop the rows (without it: say what)")
    p.set_defaults(func=cmd_retire)


def _connect(settings: Settings) -> psycopg.Connection[Any]:
    return psycopg.connect(settings.pg_dsn, autocommit=True)


def cmd_users_seed(args: argparse.Namespace) -> int:
    from sinks.users import seed_users

    settings = load_settings()
    began = time.monotonic()
    result = seed_users(settings.pg_dsn, args.count)
    print(
        f"added {result.added:,} users ({result.suppressed:,} suppressed) in "
        f"{time.monotonic() - began:.1f}s; {result.total:,} users in all"
    )
    return 0


def cmd_template_put(args: argparse.Namespace) -> int:
    from sinks.ses import SesSender, make_client

    settings = load_settings()
    SesSender(make_client(settings, timeout=10)).put_template(
        args.name, args.subject, args.html, args.text
    )
    print(f"template {args.name} stored in SES ({settings.ses_endpoint_url or 'Amazon SES'})")
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    settings = load_settings()
    ab = None
    if args.variant:
        ab = AbTest(
            variants=check_variants([parse_variant(v) for v in args.variant]),
            holdout_wait_s=parse_duration(args.holdout_wait),
            winner_by=args.winner_by,
        )
    if args.channel == "sms" and not args.body:
        raise UsageError("--channel sms needs --body TEXT (the message)")
    if args.channel == "email" and args.body:
        raise UsageError("--body is the text of an SMS campaign: add --channel sms")
    cid = create_campaign(
        settings,
        name=args.name,
        template=args.body if args.channel == "sms" else args.template,
        channel=args.channel,
        rate=args.rate,
        from_address=args.from_address,
        configuration_set=args.configuration_set,
        audience=args.audience,
        ab=ab,
    )
    print(cid)
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    from producers.campaign_ops import promote

    print(promote(load_settings(), args.id, args.variant))
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    from producers.campaign import start_campaign

    settings = load_settings()
    bar = ProgressLine(f"campaign {args.id} produce")
    result = start_campaign(settings, args.id, progress=lambda d, t: bar.update(d, t))
    bar.close()
    if args.json:
        print(json.dumps(result.__dict__))
    elif result.already_started and result.produced == 0:
        print(f"campaign {args.id} was already started: nothing new produced")
    else:
        print(
            f"campaign {args.id}: {result.recipients:,} recipients snapshotted in "
            f"{result.snapshot_s:.1f}s, {result.produced:,} produced in {result.produce_s:.1f}s"
        )
    return 0


def format_status(p: Any, promo: PromoCounts | None = None) -> str:
    rate = p.send_rate
    pending = p["pending"] + p["sending"]
    eta = f"{pending / rate:,.0f}s" if rate > 0 and pending else "-"
    return (
        f"campaign {p['id']} {p['name']!r}: {p['status']}"
        f"{' (' + p['reason'] + ')' if p['reason'] else ''}\n"
        f"  recipients {p.total:,}  sent {p['sent']:,}  pending {p['pending']:,}  "
        f"sending {p['sending']:,}  failed {p['failed']:,}  unknown {p['unknown']:,}  "
        f"skipped {p['skipped']:,}{_set_aside(p)}  cancelled {p['cancelled']:,}"
        f"{'  held ' + format(p['held'], ',') if p['held'] else ''}\n"
        f"  rate {rate:,.0f}/s (limit {p['rate_limit'] or 'unlimited'})  ETA {eta}"
        + (
            f"\n  promo codes issued {promo.issued:,}  left {promo.left:,}"
            if promo is not None
            else ""
        )
    )


def format_variants(ab: dict[str, Any] | None) -> str:
    """The A/B test's lines of status and report ('' for a campaign without variants)."""
    if ab is None:
        return ""
    winner = (
        f"winner {ab['winner']} ({ab['winner_reason']})"
        if ab["winner"]
        else f"no winner yet (by {ab['winner_by']}, {ab['holdout_wait_s']:g}s after the snapshot)"
    )
    lines = [f"  A/B test: {winner}"]
    for v in ab["variants"]:
        figures = "  ".join(f"{k} {v[k]:,}" for k in COUNTED)
        lines.append(f"    {v['name']:<8} {v['template']:<20} {v['percent']:>6g}%  {figures}")
    return "\n" + "\n".join(lines)


def _set_aside(p: Any) -> str:
    """What the snapshot skipped, when the campaign row says (older campaigns do not)."""
    duplicates, invalid = p["duplicate_addresses"], p["invalid_addresses"]
    if duplicates is None or invalid is None:
        return ""
    return f" (at snapshot: {duplicates:,} duplicate address(es), {invalid:,} invalid)"


def cmd_status(args: argparse.Namespace) -> int:
    settings = load_settings()
    with _connect(settings) as conn:
        store = CampaignStore(conn)
        while True:
            began = time.perf_counter()
            progress = store.progress(args.id)
            promo = PromoStore(conn).counts(args.id)
            query_ms = (time.perf_counter() - began) * 1000
            ab = variants_summary(VariantStore(conn), args.id)
            if args.json:
                out = {
                    **progress.as_dict(),
                    **(promo.as_dict() if promo else {}),
                    "query_ms": round(query_ms, 1),
                }
                if ab is not None:
                    out["ab_test"] = ab
                print(json.dumps(out, default=str))
            else:
                print(
                    format_status(progress, promo)
                    + f"  (query {query_ms:.0f} ms)"
                    + format_variants(ab)
                )
            if not args.watch or progress.finished or progress["status"] in ("cancelled", "done"):
                return 0
            time.sleep(2)


def cmd_control(args: argparse.Namespace) -> int:
    print(control_campaign(load_settings(), args.id, args.action, args.reason))
    return 0


def cmd_retire(args: argparse.Namespace) -> int:
    from sinks.recipient_partitions import retirable, retire

    settings = load_settings()
    with _connect(settings) as conn:
        progress = CampaignStore(conn).progress(args.id)
        if not args.yes:
            table, _ = retirable(conn, args.id)
            print(
                f"campaign {args.id} ({progress['status']}): would drop {table}, holding its "
                f"{progress.total:,} recipient row(s); add --yes to do it"
            )
            return 0
        table = retire(conn, args.id)
    print(f"campaign {args.id} retired: dropped {table} ({progress.total:,} row(s))")
    return 0
