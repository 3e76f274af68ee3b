"""`flashsend replay` (guarded offset reset) and `flashsend dlq show|replay` — see
docs/runbooks/replay.md and docs/operations.md."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

from flashsend.errors import FlashsendError
from flashsend.settings import Settings, load_settings

REFUSED = 3


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="reset a consumer's offsets under the guarded runbook (plan, refusals, audit)",
        description="Shows the plan first (per partition: from -> to, records, how many would "
        "create sends vs be deduplicated), refuses while the group has live members, when the "
        "target is older than the dedupe-key retention (transactional) or re-drives a done or "
        "cancelled campaign (unless --i-understand), asks for confirmation, then writes the "
        "PostgreSQL offset store and the broker's committed offsets and records who/when/why "
        "in offset_resets. Runbook: docs/runbooks/replay.md.\n\n"
        "  flashsend replay --group flashsend-mail --topic order.events --to-time "
        "2025-06-01T09:00:00+07:00 --dry-run\n"
        "  flashsend replay --group flashsend-sender --topic campaign.recipients --to-offset 0 "
        "--partitions 3,4 --reason 'INC-42 lost claims' --yes",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--group", required=True, help="offset-store group or Kafka group")
    p.add_argument("--topic", required=True)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-offset", type=int, help="same offset on every chosen partition")
    target.add_argument("--to-time", help="ISO time: first record at or after it")
    p.add_argument("--partitions", default="", help="comma-separated (default: all)")
    p.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument(
        "--i-understand",
        action="store_true",
        help="override the too-old / finished-campaign / lost-mail refusals",
    )
    p.add_argument("--reason", default="", help="why (recorded; required unless --dry-run)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_replay)

    dlq = sub.choices["dlq"]  # created by commands/control.py (`dlq list`)
    dsub = next(a for a in dlq._actions if isinstance(a, argparse._SubParsersAction))
    s = dsub.add_parser("show", help="one dead letter in full: headers, origin, decoded value")
    s.add_argument("ref", help="OFFSET or PARTITION:OFFSET in the dead-letter topic")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_dlq_show)
    r = dsub.add_parser(
        "replay",
        help="after fixing the cause: put dead letters back on their topic (consumers dedupe)",
        description="A record's letter goes back to its topic and partition with its key, "
        "value and headers. A letter of the SNS webhook (origin: an SNS topic ARN, value: the "
        "raw SES notification) is parsed again and its ses_event records go to mail.events, "
        "as the webhook would have produced them; nothing is replayed while one of the chosen "
        "letters is still unreadable. Every replay is recorded in dlq_replays.",
        epilog="examples:\n  flashsend dlq replay --all --dry-run\n"
        "  flashsend dlq replay 0:12 0:13 --reason 'campaign 42 restored' --yes\n"
        "  flashsend dlq replay --dead-reason no_recipients --reason 'parser fixed' --yes",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("refs", nargs="*", help="OFFSET or PARTITION:OFFSET (or --all / --reason)")
    r.add_argument("--all", action="store_true", help="every letter not replayed yet")
    r.add_argument("--dead-reason", default=None, help="only letters dead for this reason")
    r.add_argument("--again", action="store_true", help="include letters already replayed")
    r.add_argument("--dry-run", action="store_true")
    r.add_argument("--yes", action="store_true")
    r.add_argument("--reason", default="", help="why (recorded; required unless --dry-run)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_dlq_replay)


def _confirm(prompt: str, yes: bool) -> bool:
    if yes:
        return True
    if not sys.stdin.isatty():
        raise FlashsendError("not a terminal: confirm with --yes")
    return input(f"{prompt} [type yes] ").strip().lower() == "yes"


def _time_ms(text: str) -> int:
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise FlashsendError(f"--to-time must be an ISO time: {exc}") from exc
    if when.tzinfo is None:
        raise FlashsendError("--to-time needs a timezone (e.g. 2025-06-01T09:00:00+07:00)")
    return int(when.timestamp() * 1000)


def print_plan(plan: Any) -> None:
    b = plan.binding
    print(
        f"replay plan: {b.kind} consumer, offsets group {b.group_id}, Kafka group "
        f"{b.broker_group}, topic {b.topic}, live members {plan.live_members}"
    )
    print(
        f"  {'part':>4} {'from':>9} -> {'to':<9} {'dir':<6} {'records':>8} {'send':>7} "
        f"{'dedup':>7}  other"
    )
    for p in plan.partitions:
        other = {k: v for k, v in p.counts.items() if k not in ("send", "dedup")}
        print(
            f"  {p.partition:>4} {p.current:>9} -> {p.target:<9} {p.direction:<6} "
            f"{p.records:>8} {p.would_send:>7} {p.deduplicated:>7}  "
            f"{json.dumps(other) if other else ''}"
        )
    total = sum(p.would_send for p in plan.partitions)
    skipped = sum(p.records for p in plan.partitions if p.direction == "skip")
    print(f"  would create sends: {total}; records skipped without processing: {skipped}")
    if plan.campaigns:
        print(f"  campaigns in range: {plan.campaigns}")


def cmd_replay(args: argparse.Namespace) -> int:
    from producers.replay import apply_replay, plan_replay, resolve
    from streams.rules.replay_plan import blocking

    settings = load_settings()
    binding = resolve(settings, args.group, args.topic)
    partitions = [int(x) for x in args.partitions.split(",") if x.strip()]
    plan = plan_replay(
        settings,
        binding,
        to_offset=args.to_offset,
        to_time_ms=_time_ms(args.to_time) if args.to_time else None,
        partitions=partitions or None,
    )
    stop = blocking(plan.refusals, args.i_understand)
    if args.json:
        print(json.dumps({**plan.as_dict(), "blocking": [r.code for r in stop]}))
    else:
        print_plan(plan)
        for r in plan.refusals:
            print(
                f"  {'REFUSED' if r in stop else 'override'} [{r.code}] {r.message}"
                + ("  (--i-understand to override)" if r.overridable and r in stop else "")
            )
    if stop:
        return REFUSED
    if args.dry_run:
        print("dry run: nothing changed")
        return 0
    if not args.reason.strip():
        raise FlashsendError("--reason is required (it goes into the audit table)")
    if not _confirm("reset these offsets?", args.yes):
        print("not confirmed: nothing changed")
        return 1
    replay_id = apply_replay(settings, plan, reason=args.reason, forced=bool(plan.refusals))
    print(
        f"replay {replay_id} done: offsets reset in PostgreSQL and for Kafka group "
        f"{binding.broker_group}; start the workers, then verify (docs/runbooks/replay.md)"
    )
    return 0


def decode_letter(settings: Settings, letter: Any) -> dict[str, Any] | str:
    from producers.replay import bindings
    from schemas.serde import RegistryUnavailable, SerdeError, codec

    if letter.from_sns:  # the SNS webhook's: the raw SES notification
        try:
            return dict(json.loads(letter.value or b""))
        except (ValueError, TypeError) as exc:
            return f"(SES notification, not JSON: {exc})"
    schema = next((b.schema for b in bindings(settings) if b.topic == letter.topic), None)
    if schema is None:
        return "(no contract known for this topic)"
    try:
        return codec(settings, schema).decode(letter.value)
    except SerdeError as exc:
        return f"(not decodable: {exc})"
    except RegistryUnavailable as exc:
        return f"(schema registry unavailable, try again: {exc})"


def cmd_dlq_show(args: argparse.Namespace) -> int:
    from producers.dlq_replay import parse_ref, read_letters, replayed

    settings = load_settings()
    key = parse_ref(args.ref)
    letter = next(
        (x for x in read_letters(settings) if (x.dlq_partition, x.dlq_offset) == key), None
    )
    if letter is None:
        raise FlashsendError(f"no dead letter {args.ref} in {settings.topic_dlq}")
    out = {
        **letter.as_dict(),
        "decoded": decode_letter(settings, letter),
        "times_replayed": replayed(settings).get(key, 0),
    }
    if args.json:
        print(json.dumps(out, default=str))
    else:
        for k, v in out.items():
            print(f"  {k:<15} {v}")
    return 0


def cmd_dlq_replay(args: argparse.Namespace) -> int:
    from producers.dlq_replay import parse_ref, read_letters, replay_letters, replayed

    settings = load_settings()
    letters = read_letters(settings)
    done = replayed(settings)
    if args.refs:
        wanted = {parse_ref(r) for r in args.refs}
        chosen = [x for x in letters if (x.dlq_partition, x.dlq_offset) in wanted]
        missing = wanted - {(x.dlq_partition, x.dlq_offset) for x in chosen}
        if missing:
            raise FlashsendError(f"no such dead letter(s): {sorted(missing)}")
    elif args.all or args.dead_reason:
        chosen = [x for x in letters if args.dead_reason in (None, x.reason)]
    else:
        raise FlashsendError("name the letters (OFFSET …), or use --all / --dead-reason")
    skipped = [x for x in chosen if (x.dlq_partition, x.dlq_offset) in done and not args.again]
    chosen = [x for x in chosen if x not in skipped]
    for x in chosen:
        where = (
            f"{settings.topic_mail_events} as the webhook would (from {x.topic})"
            if x.from_sns
            else f"{x.topic}[{x.partition}] (was @{x.offset})"
        )
        print(f"  {x.ref:<8} {x.reason:<20} -> {where}")
    print(f"{len(chosen)} letter(s) to replay; {len(skipped)} already replayed (--again)")
    if not chosen or args.dry_run:
        return 0
    if not args.reason.strip():
        raise FlashsendError("--reason is required (it goes into the audit table)")
    if not _confirm("replay these letters?", args.yes):
        return 1
    rows = replay_letters(settings, chosen, reason=args.reason)
    if args.json:
        print(json.dumps(rows))
    print(f"replayed {len(rows)} letter(s); recorded in dlq_replays")
    return 0
