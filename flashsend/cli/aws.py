"""`flashsend aws plan|apply`: the AWS resources the feedback loop needs, in one command."""

from __future__ import annotations

import argparse
import json

from flashsend.settings import load_settings

HELP = """\
What production needs so that no bounce or complaint is lost, whatever is down on our side:

  SES   configuration sets FLASHSEND_MARKETING_CONFIGURATION_SET and
        FLASHSEND_TRANSACTIONAL_CONFIGURATION_SET, each with the event destination
        FLASHSEND_AWS_EVENTS_DESTINATION: Send, Reject, Bounce, Complaint, Delivery,
        DeliveryDelay, Rendering Failure (Open and Click off) → the SNS topic (path
        firehose: the delivery stream)
  SNS   the topic FLASHSEND_SNS_TOPIC_ARNS (first), SES allowed to publish for those sets only
        (not on the firehose path, unless the SMS configuration set needs it, against AWS)
  path sqs (--path sqs, the one for volume):
        SQS queue FLASHSEND_SQS_QUEUE (14 days, long polling, redrive to <queue>-dlq after
        FLASHSEND_SQS_MAX_RECEIVE_COUNT receives, only the topic may send) and a raw-delivery
        subscription; run `flashsend events pull` to ingest
  path webhook (--path webhook):
        an HTTPS subscription to FLASHSEND_WEBHOOK_PUBLIC_URL/sns whose delivery policy
        retries for ~59 minutes (AWS's limit is one hour)
  path firehose (--path firehose, batches: the most events per webhook core):
        the event destination → Firehose stream FLASHSEND_FIREHOSE_STREAM: HTTP endpoint
        FLASHSEND_WEBHOOK_PUBLIC_URL/firehose with the first FLASHSEND_FIREHOSE_ACCESS_KEYS
        key, gzip, FLASHSEND_FIREHOSE_BUFFER_MB / _S buffers, retries for 2 hours (the
        maximum), then undelivered records to S3 FLASHSEND_FIREHOSE_BACKUP_BUCKET. Not made:
        the IAM roles FLASHSEND_FIREHOSE_SES_ROLE and _BACKUP_ROLE and the bucket (`plan`
        says what each must allow; against AWS `apply` checks they exist); no queue
  sqs, webhook: the subscription's dead-letter queue <queue>-sns-dlq

`plan` only reads and prints what `apply` would change; `apply` makes the calls (boto3) and
checks again: a second `apply` changes nothing and says so. Real AWS when
FLASHSEND_SES_ENDPOINT and FLASHSEND_SQS_ENDPOINT are both empty (credentials from the
default chain: AWS_PROFILE, environment, instance role); against the local stack otherwise
(SES stand-in and ElasticMQ; SNS is not emulated locally and is skipped, see the notes).

examples:
  flashsend aws plan                                the local stack, FLASHSEND_EVENTS_INGEST path
  flashsend aws plan --path sqs --json
  FLASHSEND_SES_ENDPOINT= FLASHSEND_SQS_ENDPOINT= AWS_PROFILE=prod FLASHSEND_SES_REGION=eu-west-1 \\
  FLASHSEND_SNS_TOPIC_ARNS='["arn:aws:sns:eu-west-1:123456789012:flashsend-ses-events"]' \\
      flashsend aws apply --path sqs
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    aws = sub.add_parser(
        "aws",
        help="plan / apply the AWS set-up of the feedback loop (SES, SNS, SQS)",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    asub = aws.add_subparsers(dest="aws_cmd", required=True, metavar="ACTION")
    for name, text in (
        ("plan", "print what `apply` would create or change (reads only)"),
        ("apply", "create or change it with boto3, then check again (idempotent)"),
    ):
        p = asub.add_parser(
            name, help=text, description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        p.add_argument(
            "--path",
            choices=("sqs", "webhook", "firehose"),
            default=None,
            help="ingest path (default: FLASHSEND_EVENTS_INGEST, which defaults to webhook)",
        )
        p.add_argument("--json", action="store_true", help="print one JSON object")
        p.set_defaults(func=cmd_plan if name == "plan" else cmd_apply)


def _path(args: argparse.Namespace, default: str) -> str:
    from flashsend.errors import UsageError

    path = args.path or default
    if path not in ("sqs", "webhook", "firehose"):
        raise UsageError(f"FLASHSEND_EVENTS_INGEST must be sqs, webhook or firehose, not {path!r}")
    return str(path)


def cmd_plan(args: argparse.Namespace) -> int:
    from infra.aws_apply import clients, describe, desired_for, plan_json, read_current
    from infra.aws_firehose import prerequisites
    from infra.aws_plan import plan

    settings = load_settings()
    d = desired_for(settings, _path(args, settings.events_ingest))
    p = plan(d, read_current(d, clients(settings)))
    if args.json:
        out = {"path": d.path, "local": d.local, **plan_json(p)}
        if d.firehose is not None:
            out["prerequisites"] = prerequisites(d.firehose)
        print(json.dumps(out))
        return 0
    print(describe(d))
    for a in p.actions:
        print(f"  + {a.service:<7} {a.summary}")
    for line in p.up_to_date:
        print(f"  = {line}: up to date")
    for note in p.notes:
        print(f"  note: {note}")
    for arn in p.missing:
        print(f"  ! missing (not made by `apply`): {arn}")
    print(
        f"{p.changes} change(s): `flashsend aws apply` makes them"
        if p.changes
        else "nothing to change: everything is up to date"
    )
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    from infra.aws_apply import apply, clients, describe, desired_for, plan_json

    settings = load_settings()
    d = desired_for(settings, _path(args, settings.events_ingest))
    quiet = args.json
    if not quiet:
        print(describe(d))
    before, after = apply(d, clients(settings), log=(lambda _m: None) if quiet else print)
    if args.json:
        print(json.dumps({"path": d.path, "applied": plan_json(before), "left": plan_json(after)}))
    else:
        for note in before.notes:
            print(f"  note: {note}")
        if not before.changes:
            print("nothing to change: everything was up to date")
        else:
            print(f"{before.changes} change(s) made")
        if after.changes:
            print(f"still different afterwards ({after.changes}):")
            for a in after.actions:
                print(f"  ! {a.service:<7} {a.summary}")
    return 1 if after.changes else 0
