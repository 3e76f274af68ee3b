"""`flashsend demo` — the whole campaign path in one command, with a summary."""

from __future__ import annotations

import argparse
import json

from flashsend.cli.lab_result import progress_log
from flashsend.settings import load_settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="seed users, run a campaign end to end with W workers, print a summary",
        description="Seeds N users (reused if already there), creates and starts a campaign, "
        "runs W real worker processes, shows live progress and ends with a summary. "
        "Duplicates and the busiest 1-s window are measured at the SES stand-in. "
        "Needs the stack: run `flashsend up` first (make demo does). With --json the summary "
        "is printed also when the run fails or is interrupted (Ctrl-C, SIGTERM), with an "
        "`error` field; a campaign left unfinished (failure, --timeout) is cancelled. "
        "With --variants N the campaign is an A/B test: N templates (flash_sale_A, _B, …), "
        "10 % of the audience each, the rest held; once the test share is sent and "
        "--holdout-wait has passed, the demo promotes the winner (by clicks counted so far; "
        "a tie goes to A) and the rest gets its template. The summary then has `variants` "
        "(per-variant sent, delivered, bounced, complained, opened, clicked) and `winner`. "
        "With --channel sms the campaign is a text message to each user's phone through AWS End "
        "User Messaging SMS (the stand-in speaks pinpoint-sms-voice-v2): users get demo numbers, "
        "0.2 % of them invalid (skipped, invalid_phone), and the summary adds `segments`; "
        "--rate counts messages, or segments with --rate-unit segments (the summary adds "
        "`max_1s_window_segments`; the demo's body is one segment). "
        "With --local-window (users get time zones from a fixed list, one unknown) or --waves "
        "(every fifth user opened 3 days ago) the campaign is scheduled; the demo's clock "
        "jumps to the next slot once the released ones are sent, so a day's plan runs in "
        "seconds with the real workers and the real release statement. The summary then has "
        "`slots` (each slot's time, recipients, sent, waiting) and `schedule`, and "
        "`clock_jumps`. The campaign starts once the workers have joined their group "
        "(`workers_joined_s`), so `send_rate_per_s` is the steady state's; a run that fails or "
        "times out says so (`error`, `cancelled_on_exit`). With --variants the summary adds "
        "`winner_reason`; with --ramp, `ramp` (per step: its rate and its busiest sliding "
        "second wholly inside the step at the stand-in). "
        "Example: flashsend demo --users 60000 --rate 777 --json; "
        "flashsend demo --users 20000 --rate 0 --variants 2 --json; "
        "flashsend demo --users 20000 --rate 2000 --local-window 09:00-11:00 --json; "
        'flashsend demo --users 20000 --ramp "0:200,10s:600" --json; '
        "flashsend demo --channel sms --users 20000 --rate 0 --json; "
        "With --channel push the campaign is a notification to each device of each user "
        "through SNS platform endpoints (the stand-in speaks SNS): users get 0-3 devices, a few "
        "disabled (skipped with a reason) and a few opted out; --rate counts publishes; the "
        "summary adds duplicate_notifications_per_device and the skipped rows by reason "
        "(docs/push.md). Example: flashsend demo --channel push --users 20000 --rate 0 --json",
    )
    p.add_argument("--users", type=int, default=1_000_000, help="users to seed (default 1M)")
    p.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="campaign limit in recipients/s; 0 = unlimited (default)",
    )
    p.add_argument(
        "--rate-unit",
        choices=("messages", "segments"),
        default="messages",
        help="what --rate counts; segments only with --channel sms (default %(default)s)",
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument(
        "--channel",
        choices=("email", "sms", "push"),
        default="email",
        help="email (SES SendBulkEmail), sms (one SendTextMessage per user) or push (one SNS "
        "Publish per device endpoint); default %(default)s",
    )
    p.add_argument(
        "--variants",
        type=int,
        default=0,
        metavar="N",
        help="run an A/B test of N variants, 10 %% each (default: none)",
    )
    p.add_argument(
        "--holdout-wait",
        default="5s",
        metavar="DURATION",
        help="with --variants: wait this long after the snapshot before promoting the "
        "winner (default %(default)s)",
    )
    p.add_argument(
        "--ramp",
        default=None,
        metavar="OFFSET:RATE,…",
        help='send through a rate ramp, e.g. "0:100,5s:300" (see campaign create --ramp; '
        "without --rate the highest step is the limit); the summary's `ramp` gives each "
        "step's busiest sliding second at the stand-in",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="give up (and cancel the campaign) after this many s (default: %(default)s)",
    )
    p.add_argument(
        "--promo-codes",
        action="store_true",
        help="give the campaign a pool of --users generated codes and a template with "
        "{{promo_code}}; the summary adds promo_codes_issued and promo_codes_unique (checked "
        "in our rows and at the SES stand-in: each code to one address, one code per address)",
    )
    p.add_argument(
        "--local-window",
        metavar="HH:MM-HH:MM",
        help="schedule the campaign at this local time in each user's zone (default: none)",
    )
    p.add_argument("--date", metavar="YYYY-MM-DD", help="with --local-window: its local date")
    p.add_argument(
        "--waves",
        metavar="TIER:DURATION,...",
        help="engagement waves, e.g. recent:30m,rest:2d (default: none)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the summary as one JSON object on the last line of stdout",
    )
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from flashsend.lab.demo import DemoOptions, run_demo
    from flashsend.lab.run import sigterm_interrupts
    from streams.rules.ab_test import parse_duration

    settings = load_settings()
    with sigterm_interrupts():
        summary = run_demo(
            settings,
            DemoOptions(
                users=args.users,
                rate=args.rate,
                workers=args.workers,
                timeout_s=args.timeout,
                promo_codes=args.promo_codes,
                variants=args.variants,
                holdout_wait_s=parse_duration(args.holdout_wait),
                local_window=args.local_window,
                date=args.date,
                waves=args.waves,
                ramp=args.ramp or "",
                channel=args.channel,
                rate_unit=args.rate_unit,
            ),
            progress_log(args),
        )
    if args.json:
        print(json.dumps(summary))
    else:
        print("\nsummary:")
        for key, value in summary.items():
            print(f"  {key:<18} {value}")
    ok = (
        "error" not in summary
        and summary.get("pending") == 0
        and summary.get("sending") == 0
        and not summary.get("held")
        and summary.get("duplicates") in (0, None)
        and summary.get("promo_codes_unique", True) is True
    )
    return 0 if ok else 1
