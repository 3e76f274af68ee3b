"""`flashsend campaign resend-unknown`: mail again the unknown rows no SES event has proved."""

from __future__ import annotations

import argparse
import json
from typing import Any

from flashsend.errors import FlashsendError, UsageError
from flashsend.settings import load_settings
from sinks.audit_store import Actor
from streams.rules.resolution import RESEND_FROM, parse_duration

SAMPLE = 10

DESCRIPTION = """\
A row is `unknown` when its SES call got no answer (worker killed mid-call, timeout): SES may
or may not have sent it. SES's own events settle most of them on their own — the feedback
worker turns a row with a Send/Delivery/Bounce/Complaint/DeliveryDelay event into `sent`
(Reject: `failed`), reason resolved_by_event. What is still unknown after a grace long enough
for the events to arrive was most likely never accepted by SES; this command queues exactly
those rows again. It is never run automatically.

Without --yes it only shows what it would do (how many rows, a sample) and changes nothing.
With --yes, in one transaction: the rows still unknown whose call started more than
--older-than ago go back to `pending` (reason resend_unknown), a `done` campaign goes back to
`sending`, and the unknown_resends table records who, when, why and which rows; then their
doorbells are produced as `campaign reconcile` does (a paused campaign gets them on resume).
First it waits (--wait-feedback, a minute) until the feedback worker has applied every SES event
mail.events holds, and refuses if it has not (one of them may prove a row sent).

Examples:
  flashsend campaign resend-unknown 42 --older-than 30m            # dry run: how many, which
  flashsend campaign resend-unknown 42 --older-than 30m --yes --reason "SES outage 10:05"
  flashsend campaign resend-unknown 42 --older-than 2h --json      # the plan as JSON
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    camp = sub.choices["campaign"]
    csub = next(a for a in camp._actions if isinstance(a, argparse._SubParsersAction))
    p = csub.add_parser(
        "resend-unknown",
        help="mail again the rows still unknown after a grace (no SES event proved them); "
        "dry run unless --yes",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("id", type=int, help="campaign id")
    p.add_argument(
        "--older-than",
        required=True,
        metavar="DURATION",
        help="only rows whose SES call started longer ago than this (90s, 15m, 2h, 1h30m, 1d); "
        "give SES's events time to arrive first",
    )
    p.add_argument("--yes", action="store_true", help="really queue them (without it: dry run)")
    p.add_argument(
        "--reason",
        default="operator resend-unknown",
        help="recorded in unknown_resends (default: %(default)s)",
    )
    p.add_argument(
        "--sample", type=int, default=SAMPLE, help="rows listed in the output (%(default)s)"
    )
    p.add_argument(
        "--ignore-feedback-lag",
        action="store_true",
        help="act even if the feedback worker has SES events left to apply (risks duplicates)",
    )
    p.add_argument(
        "--wait-feedback",
        type=float,
        default=60.0,
        metavar="S",
        help="how long to wait for the feedback worker to apply the SES events already "
        "received before refusing (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_resend_unknown)


def cmd_resend_unknown(args: argparse.Namespace) -> int:
    from producers.resend_unknown import check_feedback_caught_up, plan_resend, resend_unknown

    try:
        older_than_s = parse_duration(args.older_than)
    except ValueError as exc:
        raise UsageError(f"--older-than: {exc}") from None
    settings = load_settings()
    plan = plan_resend(settings, args.id, older_than_s)
    out: dict[str, Any] = {
        "campaign_id": plan.campaign_id,
        "campaign_status": plan.campaign_status,
        "older_than_s": older_than_s,
        "unknown_older": len(plan.rows),
        "sample": [
            {
                "seq": r.seq,
                "user_id": r.user_id,
                "email": r.email,
                "reason": r.reason,
                "claimed_at": r.claimed_at.isoformat() if r.claimed_at else None,
            }
            for r in plan.rows[: max(0, args.sample)]
        ],
        "refusal": plan.refusal,
        "dry_run": not args.yes,
    }
    if args.yes and plan.rows and plan.refusal is None:
        if not args.ignore_feedback_lag:
            check_feedback_caught_up(settings, wait_s=args.wait_feedback)
        try:
            actor = Actor.cli(settings.operator)
            out.update(resend_unknown(settings, plan, reason=args.reason, actor=actor).as_dict())
        except FlashsendError as exc:
            if "re-produce failed" not in str(exc):
                raise
            out["produce_error"] = str(exc)
    _print(args, out)
    return 1 if plan.refusal is not None and plan.rows else 0


def _print(args: argparse.Namespace, out: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(out))
        return
    cid, n = out["campaign_id"], out["unknown_older"]
    print(
        f"campaign {cid} ({out['campaign_status']}): {n:,} row(s) still unknown whose call "
        f"started more than {args.older_than} ago"
    )
    for r in out["sample"]:
        print(f"  seq {r['seq']:>9}  {r['email']:<40} {r['reason'] or '-':<20} {r['claimed_at']}")
    if n > len(out["sample"]):
        print(f"  … and {n - len(out['sample']):,} more")
    if out["refusal"] is not None:
        print(f"not resendable: {out['refusal']}")
    elif not n:
        print("nothing to resend")
    elif out["dry_run"]:
        print(
            f"dry run: nothing changed. With --yes they go back to pending and are "
            f"{RESEND_FROM[out['campaign_status']]}."
        )
    else:
        print(
            f"queued {out['moved']:,} row(s) again (audit id {out['audit_id']}); "
            f"{out['produced']:,} doorbell(s) produced"
            f"{'; campaign reopened (sending)' if out['reopened'] else ''}"
        )
        if out.get("produce_error"):
            print(
                f"producing failed ({out['produce_error']}); the rows stay flagged and the "
                f"workers' reconcile (or `flashsend campaign reconcile {cid}`) produces them"
            )
