"""`flashsend events pull`: SES events from SQS onto mail.events (docs/deliverability.md)."""

from __future__ import annotations

import argparse

from flashsend.cli.lab_result import run_and_print
from flashsend.settings import load_settings

PULL_HELP = """\
SES → SNS → SQS (raw message delivery) → this → mail.events, the ingest path AWS recommends
for volume (the other is `flashsend webhook`). SQS keeps the events while Kafka or this
process is down (up to the queue's retention, 14 days as `flashsend aws apply` sets it).

Each puller long-polls ReceiveMessage (10 messages), publishes the records the webhook would
publish for the same events, waits for the broker's acknowledgement, then deletes the
messages. Not acknowledged: the messages stay in SQS and come back after the visibility
timeout, and no puller receives until the broker answers again. A body that is not an SES
event goes to the dead-letter topic (`flashsend dlq list`) and is deleted.

examples:
  flashsend events pull                          the queue FLASHSEND_SQS_QUEUE, 4 pullers
  flashsend events pull --pullers 8              more ReceiveMessage calls in flight
  FLASHSEND_SQS_ENDPOINT= AWS_PROFILE=prod flashsend events pull --queue flashsend-ses-events
  flashsend events pull --queue-url https://sqs.eu-west-1.amazonaws.com/123456789012/events

`flashsend up` starts one when `puller` is in FLASHSEND_LOCAL_SERVICES (with `sqs`, the local
ElasticMQ server). Stop with SIGTERM/Ctrl-C: batches in hand are finished first.
"""


OUTAGE_HELP = """\
A campaign runs on the local stack (SES stand-in injecting hard bounces and complaints, a
feedback worker, campaign workers, and the ingest path under test); once --outage-when-sent of
it was sent, the stack's Kafka broker is stopped for --seconds, then started again (the
workers go on sending what they had fetched, so events keep coming during the outage). Afterwards
every address the stand-in bounced or complained must be in the suppression table, and no
other: `ok`, `lost` and `extra` in the result say so. Works in a scratch database, queue and
configuration set; every Kafka client of the stack sees the outage.

  --path sqs      stand-in → SQS (ElasticMQ, `sqs` in FLASHSEND_LOCAL_SERVICES) → events pull:
                  SQS keeps the events while the puller cannot publish
  --path webhook  stand-in → signed SNS POST → webhook: 503 while the broker is down, the
                  stand-in retries as SNS does (within its retry window)

examples:
  flashsend feedback outage --seconds 180 --path sqs --json
  flashsend feedback outage --seconds 60 --path webhook --users 5000
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ev = sub.add_parser("events", help="SES events through SQS: `events pull`")
    esub = ev.add_subparsers(dest="events_cmd", required=True, metavar="ACTION")
    p = esub.add_parser(
        "pull",
        help="pull SES events from SQS onto mail.events (the SQS ingest path)",
        description=PULL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--queue", default=None, help="queue name (default FLASHSEND_SQS_QUEUE)")
    p.add_argument("--queue-url", default=None, help="queue URL (instead of --queue)")
    p.add_argument(
        "--pullers", type=int, default=None, help="concurrent long polls (FLASHSEND_EVENTS_PULLERS)"
    )
    p.add_argument(
        "--wait-s", type=int, default=None, help="long-poll wait, 0-20 (FLASHSEND_EVENTS_WAIT_S)"
    )
    p.add_argument(
        "--visibility-s",
        type=int,
        default=None,
        help="seconds a received message stays hidden (FLASHSEND_EVENTS_VISIBILITY_S)",
    )
    p.add_argument("--loglevel", default="info")
    p.set_defaults(func=cmd_pull)

    # `flashsend feedback outage`, beside `feedback e2e|bench` (cli/feedback.py)
    fb = sub.choices["feedback"]
    fsub = next(a for a in fb._actions if isinstance(a, argparse._SubParsersAction))
    p = fsub.add_parser(
        "outage",
        help="stop Kafka for a while during a campaign: every bounce and complaint must still "
        "reach the suppression table",
        description=OUTAGE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seconds", type=float, default=180.0, help="broker down for (default 180)")
    p.add_argument("--path", choices=("sqs", "webhook"), default="sqs", help="default sqs")
    p.add_argument("--users", type=int, default=20_000, help="campaign size (default 20000)")
    p.add_argument("--rate", type=float, default=200.0, help="recipients/s (default 200)")
    p.add_argument("--bounces", type=float, default=0.02, help="share of hard bounces")
    p.add_argument("--complaints", type=float, default=0.003, help="share of complainers")
    p.add_argument("--workers", type=int, default=1, help="campaign worker processes")
    p.add_argument(
        "--outage-when-sent",
        type=float,
        default=0.1,
        help="share of the users sent when the broker stops (default 0.1)",
    )
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_outage)


def cmd_pull(args: argparse.Namespace) -> int:
    from flashsend.errors import UsageError
    from producers.sqs_client import queue_url
    from producers.sqs_puller import PullerConfig, run_pull

    settings = load_settings()
    pullers = args.pullers if args.pullers is not None else settings.events_pullers
    wait_s = args.wait_s if args.wait_s is not None else settings.events_wait_s
    visibility = settings.events_visibility_s if args.visibility_s is None else args.visibility_s
    if pullers < 1:
        raise UsageError("--pullers must be at least 1")
    if not 0 <= wait_s <= 20:
        raise UsageError("--wait-s must be between 0 and 20 (SQS's longest long poll)")
    if visibility < 10:
        raise UsageError("--visibility-s must be at least 10 (a batch must be acknowledged in it)")
    url = args.queue_url or queue_url(settings, args.queue)
    config = PullerConfig(url, pullers=pullers, wait_s=wait_s, visibility_s=visibility)
    return run_pull(settings, config, args.loglevel)


def cmd_outage(args: argparse.Namespace) -> int:
    from flashsend.lab.feedback_outage import OutageOptions, run_outage_scratch

    options = OutageOptions(
        seconds=args.seconds,
        path=args.path,
        users=args.users,
        rate=args.rate,
        p_bounce=args.bounces,
        p_complaint=args.complaints,
        workers=args.workers,
        outage_when_sent=args.outage_when_sent,
        timeout_s=args.timeout,
    )
    return run_and_print(
        args,
        lambda log: run_outage_scratch(load_settings(), options, log=log),
        exit_on_ok=True,
        interruptible=True,
    )
