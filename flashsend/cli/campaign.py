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
    RATE_UNITS,
    AbTest,
    control_campaign,
    create_campaign,
)
from sinks.audit_store import Actor
from sinks.campaign_store import CampaignStore
from sinks.campaign_views import status_view
from sinks.promo_store import PromoCounts, PromoStore
from sinks.ramp_store import format_ramp_status, ramp_status
from sinks.schedule_store import ScheduleStore, schedule_summary
from sinks.seed_store import SeedPlan
from sinks.variant_store import COUNTED, VariantStore, variants_summary
from streams.rules.ab_test import WINNER_BY, check_variants, parse_duration, parse_variant
from streams.rules.feedback_lag import REPORT_FRESH_S
from streams.rules.ramp import parse_ramp
from streams.rules.seed_list import DEFAULT_HOLD_S, SeedListError, parse_seed_list
from streams.rules.send_plan import schedule_from_flags


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
        "Scheduled sending: --local-window 09:00-11:00 [--date 2026-12-05] sends each "
        "recipient at the window's start in their users.timezone (now, if inside it); "
        "--waves recent:30m,rest:2d sends those who opened or clicked recently first, "
        "spread over 30 minutes, then everyone else spread over 2 days. Rows not yet due wait "
        "`held`; the workers release each slot when it comes due. Example: flashsend campaign "
        "create --name morning --local-window 09:00-11:00 --date 2026-12-05. "
        'A warming domain: --ramp "0:200,10m:600,30m:1200" sends at 200/s for the first ten '
        "minutes of sending, then 600/s, then 1,200/s from thirty minutes on (time paused "
        "does not count). "
        "Correction: --correction-of N sends to exactly the users campaign N sent to (rows "
        "`sent`; not failed, skipped, unknown or cancelled ones, nor N's seeds), within "
        "--audience (default: active and opted in); suppressions and opt-outs since N still "
        "apply. Example: flashsend campaign pause 41 && flashsend campaign create --name "
        "'sale: the right code' --template sale_fixed --correction-of 41. "
        "SMS: --channel sms --body TEXT texts each user's phone (users.phone, E.164 after "
        "normalising; others are skipped, invalid_phone) from FLASHSEND_SMS_ORIGINATION_IDENTITY; "
        "--rate counts messages, or segments with --rate-unit segments (a 200-character "
        "GSM-7 body is 2). Example: flashsend campaign create --name sale-sms "
        "--channel sms --body 'Hi {{first_name}}, -50% today. Reply STOP to opt out' --rate 50. "
        "Quiet hours: an SMS campaign texts only within FLASHSEND_SMS_SEND_HOURS (08:00-21:00) "
        "of each user's local day (users.timezone); a --local-window must lie within them, and "
        "a row not sent by its window's end is skipped, quiet_hours, never texted late. "
        "Push: --channel push --body TEXT --from TITLE [--ttl S] [--collapse-key K] notifies "
        "every enabled device endpoint of each user (SNS Publish); --rate counts publishes; "
        "quiet hours as for SMS (FLASHSEND_PUSH_SEND_HOURS); see docs/push.md.",
    )
    p.add_argument(
        "--channel",
        choices=("email", "sms", "push"),
        default="email",
        help="email (SES), sms (AWS End User Messaging SMS) or push (SNS platform endpoints); "
        "default %(default)s",
    )
    p.add_argument(
        "--ttl",
        type=int,
        default=None,
        help="with --channel push: the notification's lifetime in seconds (0..2419200)",
    )
    p.add_argument(
        "--collapse-key",
        default=None,
        help="with --channel push: a newer notification with this key replaces an undelivered "
        "older one on the device",
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
        "(default FLASHSEND_DEFAULT_RATE); an SMS campaign's counts --rate-unit",
    )
    p.add_argument(
        "--rate-unit",
        choices=RATE_UNITS,
        default="messages",
        help="what --rate counts: messages, or segments (SMS only: a message costs its "
        "segments, GSM-7 160 characters / 153 once split, UCS-2 70 / 67); default %(default)s",
    )
    p.add_argument(
        "--ramp",
        default=None,
        metavar="OFFSET:RATE,…",
        help='rate steps over the campaign\'s sending time, e.g. "0:200,10m:600,30m:1200": '
        "the first at 0, the last holds; each step is capped by --rate, which defaults to the "
        "highest step (default: no ramp)",
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
    p.add_argument(
        "--local-window",
        metavar="HH:MM-HH:MM",
        help="send at this local time in each recipient's zone (users.timezone; none or an "
        "unknown name: FLASHSEND_DEFAULT_TIMEZONE, default UTC): each recipient is due at "
        "the window's start in their zone, or at once while their window is on; "
        "e.g. 09:00-11:00",
    )
    p.add_argument(
        "--date",
        metavar="YYYY-MM-DD",
        help="the local date of --local-window; a zone whose window already ended that date "
        "is skipped (reason window_passed). Default: each zone's next window (today's if "
        "not ended, else tomorrow's)",
    )
    p.add_argument(
        "--waves",
        metavar="TIER:DURATION,...",
        help="engagement waves in order, each spread over its duration and starting when the "
        "one before ends: `recent` (opened or clicked within FLASHSEND_RECENT_ENGAGEMENT_DAYS, "
        "default 30) then `rest` (everyone else, last); e.g. recent:30m,rest:2d",
    )
    p.add_argument(
        "--correction-of",
        type=int,
        default=None,
        metavar="N",
        help="audience = the users campaign N sent to (status sent); N must have sent, and "
        "must be paused, cancelled or done when this campaign starts",
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
        "as invalid_email. A campaign whose recipients do not fit the SES account's 24-hour "
        "quota (Max24HourSend - SentLast24Hours - what other live campaigns still hold) is "
        "refused with the figures and stays a draft. "
        "Example: flashsend campaign start 42 && flashsend campaign status 42. "
        "Seed list first: --seed-list FILE (one address a line, # comments) sends the mail to "
        "those addresses at once and holds the audience (rows `held`) for --hold, until the "
        "hold runs out (a worker's reconcile releases it) or `campaign release 42`; cancel "
        "during the hold sends nothing more. A seed address that is also in the audience gets "
        "the mail once, as a seed (its audience row is skipped, seed_address). Example: "
        "flashsend campaign start 42 --seed-list seeds.txt --hold 5m",
    )
    p.add_argument("id", type=int, help="campaign id (from campaign create)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument(
        "--ignore-quota",
        action="store_true",
        help="start even when the 24-hour quota is short (the campaign pauses at "
        "ACCOUNT_DAILY_QUOTA_EXCEEDED when SES runs out)",
    )
    p.add_argument(
        "--spread-over-quota",
        action="store_true",
        help="when the campaign does not fit the 24-hour quota, plan it over days instead of "
        "refusing it: what the quota has left now goes today, the rest waits `held` in one "
        "slot a day of the same size, each starting once the day before has left SES's "
        "rolling 24 hours (status shows the slots; a plain campaign only: no A/B test, "
        "schedule or seed list)",
    )
    p.add_argument(
        "--seed-list",
        default=None,
        metavar="FILE",
        help="addresses that get the mail first (read only by the start that snapshots)",
    )
    p.add_argument(
        "--hold",
        default=None,
        metavar="DURATION",
        help=f"how long the audience waits after the snapshot, with --seed-list: 90s, 5m, 1h "
        f"(default {DEFAULT_HOLD_S / 60:g}m)",
    )
    p.set_defaults(func=cmd_start)

    p = csub.add_parser(
        "release",
        help="end a seed hold now: the audience is produced",
        description="The audience of a campaign started with --seed-list waits until its hold "
        "runs out; release ends it early. A sending campaign's audience is produced before the "
        "command returns, a paused one's on resume. Safe to run twice or while the hold runs "
        "out: one statement releases only while nobody has. Example: flashsend campaign "
        "release 42",
    )
    p.add_argument("id", type=int, help="campaign id")
    p.add_argument(
        "--by",
        default=None,
        help="who releases, recorded and shown by status/report (default: your login name)",
    )
    p.set_defaults(func=cmd_release)

    p = csub.add_parser(
        "status",
        help="counts per status, rate and ETA (trigger-kept counters: ~1 ms at 1M rows)",
        description="Counts per status from trigger-kept counters, and what the snapshot "
        "skipped (duplicate and invalid addresses; `campaign report` lists every reason). "
        "A campaign with a promo pool also shows its codes issued and left (counted over the "
        "pool's partial indexes). With a ramp: its step, the rate now and the next change "
        "(`ramp` in --json). While a sending campaign waits for a lagging feedback agent: the "
        "line 'waiting for the feedback agent: N s behind' (`feedback_lag_s` in --json; null "
        "when no agent reports). A scheduled campaign lists its slots, a seed hold its seeds. "
        "Example: flashsend campaign status 42 --watch",
    )
    p.add_argument("id", type=int, help="campaign id")
    p.add_argument("--json", action="store_true", help="print one JSON object per refresh")
    p.add_argument("--watch", action="store_true", help="refresh until the campaign is done")
    p.set_defaults(func=cmd_status)

    for action, help_text, description in (
        (
            "pause",
            "stop SES calls within a second",
            "Each worker re-checks the campaign right before every SES call, so no call starts "
            "after the pause is committed; calls in flight finish and are recorded. Held "
            "releases (schedule slots, a seed hold, an A/B holdout) wait for resume too.",
        ),
        (
            "resume",
            "continue a paused campaign",
            "Produces again only the rows whose doorbell was consumed while the campaign was "
            "paused; nobody is sent twice.",
        ),
        (
            "cancel",
            "cancel every still-pending recipient",
            "Every pending and held row becomes cancelled; calls in flight finish and are "
            "recorded, nothing more is sent.",
        ),
    ):
        p = csub.add_parser(action, help=help_text, description=description)
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
    if args.channel in ("sms", "push") and not args.body:
        raise UsageError(f"--channel {args.channel} needs --body TEXT (the message)")
    if args.channel == "email" and args.body:
        raise UsageError("--body is the text of an SMS or push campaign: add --channel")
    schedule = schedule_from_flags(args.local_window, args.date, args.waves)
    cid = create_campaign(
        settings,
        name=args.name,
        template=args.body if args.channel in ("sms", "push") else args.template,
        channel=args.channel,
        push_ttl_s=args.ttl,
        push_collapse_key=args.collapse_key,
        rate_unit=args.rate_unit,
        rate=args.rate,
        from_address=args.from_address,
        configuration_set=args.configuration_set,
        audience=args.audience,
        ab=ab,
        schedule=schedule,
        ramp=parse_ramp(args.ramp) if args.ramp is not None else None,
        correction_of=args.correction_of,
        actor=Actor.cli(settings.operator),
    )
    print(cid)
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    import getpass

    from producers.campaign_ops import release

    settings = load_settings()
    by = args.by or f"campaign release ({getpass.getuser()})"
    print(release(settings, args.id, by, Actor.cli(settings.operator)))
    return 0


def read_seed_plan(path: str | None, hold: str | None) -> SeedPlan | None:
    """`--seed-list FILE [--hold D]`, checked before anything is written."""
    if path is None:
        if hold is not None:
            raise SeedListError("--hold needs --seed-list FILE (the addresses that go first)")
        return None
    try:
        with open(path, encoding="utf-8") as f:
            emails = parse_seed_list(f, path)
    except OSError as exc:
        raise SeedListError(f"--seed-list {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SeedListError(f"--seed-list {path}: not UTF-8 text") from None
    return SeedPlan(emails, DEFAULT_HOLD_S if hold is None else parse_duration(hold))


def cmd_promote(args: argparse.Namespace) -> int:
    from producers.campaign_ops import promote

    settings = load_settings()
    print(promote(settings, args.id, args.variant, Actor.cli(settings.operator)))
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    from producers.campaign import start_campaign

    seeds = read_seed_plan(args.seed_list, args.hold)
    settings = load_settings()
    bar = ProgressLine(f"campaign {args.id} produce")
    result = start_campaign(
        settings,
        args.id,
        progress=lambda d, t: bar.update(d, t),
        ignore_quota=args.ignore_quota,
        spread_over_quota=args.spread_over_quota,
        seeds=seeds,
        actor=Actor.cli(settings.operator),
    )
    bar.close()
    days = quota_plan(settings, args.id) if args.spread_over_quota else None
    if args.json:
        print(json.dumps({**result.__dict__, **({"quota_plan": days} if days else {})}))
    elif result.already_started and result.produced == 0:
        print(f"campaign {args.id} was already started: nothing new produced")
    else:
        print(
            f"campaign {args.id}: {result.recipients:,} recipients snapshotted in "
            f"{result.snapshot_s:.1f}s, {result.produced:,} produced in {result.produce_s:.1f}s"
            + (
                f"; {len(seeds.emails):,} seed address(es) first, the audience held "
                f"{seeds.hold_s:g}s (flashsend campaign release {args.id} ends it now)"
                if seeds is not None and not result.already_started
                else ""
            )
            + (
                f"; over the 24-hour quota: {days['days']} day(s) of {days['per_day']:,}, "
                f"each {days['period_s'] / 3600:.2f} h after the one before "
                f"(flashsend campaign status {args.id} shows them)"
                if days
                else ""
            )
        )
    return 0


def quota_plan(settings: Any, campaign_id: int) -> dict[str, Any] | None:
    """The plan over days a `--spread-over-quota` start made (None when the campaign fit)."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        stored = ScheduleStore(conn).stored(campaign_id)
    plan = (stored or {}).get("quota_plan")
    return dict(plan) if plan else None


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
        f"  rate {rate:,.0f}/s (limit {format_limit(p)})  ETA {eta}"
        + format_hold(p)
        + (f"\n  correction of campaign {p['correction_of']}" if p["correction_of"] else "")
        + (
            f"\n  promo codes issued {promo.issued:,}  left {promo.left:,}"
            if promo is not None
            else ""
        )
    )


def format_feedback_lag(p: Any, lag_s: float | None, max_lag_s: float) -> str:
    """Why a sending campaign stands still: the feedback agent is too far behind (workers
    hold every campaign's calls until it is back within half of `max_lag_s`)."""
    if p["status"] != "sending" or lag_s is None or max_lag_s <= 0 or lag_s <= max_lag_s:
        return ""
    return (
        f"\n  waiting for the feedback agent: {lag_s:.1f} s behind "
        f"(calls wait over {max_lag_s:g} s, go on under {max_lag_s / 2:g} s)"
    )


def format_limit(p: Any) -> str:
    """The campaign's rate limit; an SMS campaign's with its unit (messages or segments per
    second: the measured rate beside it counts messages either way)."""
    limit = p["rate_limit"]
    if not limit:
        return "unlimited"
    if p["channel"] == "sms":
        return f"{limit} {p['rate_unit']}/s"
    if p["channel"] == "push":
        return f"{limit} publishes/s"
    return f"{limit}"


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


def format_slots(
    schedule: dict[str, Any] | None, limit: int = 12, *, only_open: bool = True
) -> str:
    """A scheduled campaign's lines of status: the plan, then progress per slot (the first
    `limit` not finished, or every slot; --json lists them all)."""
    if schedule is None:
        return ""
    if schedule.get("local_window"):
        w = schedule["local_window"]
        plan = f"local window {w['start']}-{w['end']} {w['date'] or '(next per zone)'}"
    elif schedule.get("quota_plan"):
        q = schedule["quota_plan"]
        plan = (
            f"over the 24-hour quota, {q['days']} day(s) of {q['per_day']:,} "
            f"every {q['period_s'] / 3600:.2f} h"
        )
    else:
        plan = "waves " + ",".join(f"{w['tier']}:{w['span_s']:g}s" for w in schedule["waves"])
    unknown = schedule.get("unknown_timezones") or {}
    lines = [
        f"  schedule: {plan}; {schedule['slots_released']}/{len(schedule['slots'])} slot(s) "
        f"released, {schedule['waiting']:,} waiting"
        + (f"; unknown zones (sent as the default): {unknown}" if unknown else "")
    ]
    open_slots = [s for s in schedule["slots"] if s["waiting"] or s["in_progress"] or not only_open]
    for s in open_slots[:limit]:
        lines.append(
            f"    slot {s['slot_at']}  total {s['recipients']:,}  sent {s['sent']:,}  "
            f"in progress {s['in_progress']:,}  waiting {s['waiting']:,}  other {s['other']:,}"
        )
    if len(open_slots) > limit:
        lines.append(f"    … {len(open_slots) - limit} more slot(s) (--json lists all)")
    return "\n" + "\n".join(lines)


def format_hold(p: Any) -> str:
    """The seed list's and the hold's line of status and report ('' without a seed list)."""
    if not p["seed_recipients"] and p["hold_until"] is None:
        return ""
    seed = p["seed"] or {}
    figures = "  ".join(f"{k} {n:,}" for k, n in sorted(seed.items()))
    if p["hold_released_at"] is not None:
        hold = f"hold released {p['hold_released_at']} by {p['hold_released_by']}"
    elif p["hold_until"] is not None:
        hold = f"audience held until {p['hold_until']}"
    else:
        hold = ""
    return f"\n  seed list {p['seed_recipients'] or 0:,}: {figures}; {hold}"


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
            schedule = schedule_summary(ScheduleStore(conn), args.id)
            ramp = ramp_status(conn, args.id)
            feedback_lag = store.feedback_lag(REPORT_FRESH_S)
            if args.json:
                print(json.dumps(status_view(conn, args.id), default=str))
            else:
                print(
                    format_status(progress, promo)
                    + f"  (query {query_ms:.0f} ms)"
                    + format_feedback_lag(progress, feedback_lag, settings.feedback_max_lag_s)
                    + format_ramp_status(ramp)
                    + format_variants(ab)
                    + format_slots(schedule)
                )
            if not args.watch or progress.finished or progress["status"] in ("cancelled", "done"):
                return 0
            time.sleep(2)


def cmd_control(args: argparse.Namespace) -> int:
    settings = load_settings()
    actor = Actor.cli(settings.operator)
    print(control_campaign(settings, args.id, args.action, args.reason, actor))
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
        table = retire(conn, args.id, Actor.cli(settings.operator))
    print(f"campaign {args.id} retired: dropped {table} ({progress.total:,} row(s))")
    return 0
