"""`flashsend bench` — the headline figures in one run, with the naive baseline."""

from __future__ import annotations

import argparse
from pathlib import Path

from flashsend.cli.lab_result import print_result, progress_log
from flashsend.settings import load_settings

DESCRIPTION = """\
Runs on the local stack (`flashsend up` first): the main campaign (rate unlimited), a limiter
sweep (one short campaign per rate), pause/resume cycles at --pause-rate and at full speed,
then the naive one-SendEmail-per-user loop. Takes several minutes for 1M users. Prints a
table, or one JSON object as the last line with --json (also when the run fails or is
interrupted: then with an `error` field, and the campaigns it started cancelled); writes
bench/results/<timestamp>.json and a PNG plot.

Key figures: limiter_sweep / limiter_worst_ratio (busiest sliding second at the SES stand-in
/ limit), pause_latency_ms (pause command returned -> last entry SES accepted), status_query_ms
(timed while the main campaign sends), end_to_end_rate_per_s, cpu_us_per_recipient_product
(the stand-in's CPU apart; the webhook and the feedback worker in), events_lag_p99_s (an SES
event's POST to its row in PostgreSQL, while the main campaign sends at full speed),
events_dropped_at_standin (events the stand-in gave up on: at full speed on two cores its
emitter falls behind), events_backlog_at_start (events the feedback agent had to apply first),
machine_reference_ms (CPU time of a fixed workload at start, while sending and at the end: this
machine's speed drifts, so compare runs whose references agree). docs/performance.md explains
each.

Each 1M run adds ~0.6 GB to the SES stand-in's journal, which it replays at start (`flashsend
up` waits longer); `curl -X POST http://127.0.0.1:14566/_admin/reset` empties it.

Examples:
  flashsend bench --json                                    # the full 1M run
  flashsend bench --users 20000 --sweep-rates 37,777,3120 --sweep-seconds 4 --pauses 3 --json
"""


def _rates(text: str) -> tuple[float, ...]:
    from flashsend.lab.bench_figures import parse_rates

    try:
        return tuple(parse_rates(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from flashsend.lab.bench_figures import DEFAULT_SWEEP_RATES, DEFAULT_SWEEP_SECONDS

    p = sub.add_parser(
        "bench",
        help="measure snapshot/produce/send rates, CPU per recipient, the limiter at 8 rates, "
        "pause latency, status query time and the naive baseline; writes bench/results/",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--users",
        type=int,
        default=1_000_000,
        help="users to seed; about 86%% become recipients, the rest are inactive, opted "
        "out, suppressed or invalid (default: %(default)s)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help="sending workers started for the campaigns (default: %(default)s)",
    )
    p.add_argument(
        "--ses-latency-ms",
        type=int,
        default=0,
        help="latency the SES stand-in adds to every call; the seed assumes 80 "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--naive-users",
        type=int,
        default=20_000,
        help="users for the one-SendEmail-per-user baseline loop (default: %(default)s)",
    )
    p.add_argument(
        "--sweep-rates",
        type=_rates,
        default=DEFAULT_SWEEP_RATES,
        metavar="R,R,…",
        help="limits (recipients/s) of the limiter sweep, one short campaign each (default: "
        + ",".join(f"{r:g}" for r in DEFAULT_SWEEP_RATES)
        + ")",
    )
    p.add_argument(
        "--sweep-seconds",
        type=float,
        default=DEFAULT_SWEEP_SECONDS,
        help="how long each sweep campaign sends: it gets rate x this many recipients; the "
        "steady state leaves out its first and last second (default: %(default)s)",
    )
    p.add_argument(
        "--pauses",
        type=int,
        default=5,
        help="pause/resume cycles timed at each of the two rates; 0 skips them "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--pause-rate",
        type=float,
        default=1000.0,
        help="the limited campaign's rate for the pauses; the other runs at full speed "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--no-events",
        dest="events",
        action="store_false",
        help="run no feedback worker: the main campaign's SES events are not applied and "
        "events_lag_* are null (default: a feedback worker applies them, events_lag_* say how "
        "far behind it was, and its CPU counts as the product's)",
    )
    p.add_argument(
        "--brokers",
        type=int,
        default=None,
        help="refuse to run unless the stack's Kafka has this many brokers (start a cluster "
        "with FLASHSEND_KAFKA_BROKERS=3 flashsend up); the JSON always has `brokers`",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results"),
        help="folder for <timestamp>.json and the PNG plot (default: %(default)s)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the figures as one JSON object on the last line of stdout",
    )
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from flashsend.lab.bench import BenchOptions, run_bench
    from flashsend.lab.run import sigterm_interrupts

    with sigterm_interrupts():
        result = run_bench(
            load_settings(),
            BenchOptions(
                users=args.users,
                workers=args.workers,
                ses_latency_ms=args.ses_latency_ms,
                naive_users=args.naive_users,
                sweep_rates=args.sweep_rates,
                sweep_seconds=args.sweep_seconds,
                pauses=args.pauses,
                pause_rate=args.pause_rate,
                out_dir=args.out,
                events=args.events,
                brokers=args.brokers,
            ),
            progress_log(args),
        )
    print_result(args, result, 24)
    return 1 if "error" in result else 0
