"""`flashsend bench` — the headline figures in one run, with the naive baseline."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flashsend.settings import load_settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench",
        help="measure snapshot/produce/send rates, CPU per recipient, limiter accuracy, pause "
        "latency, status query time and the naive baseline; writes bench/results/",
        description="Runs on the local stack (`flashsend up` first). Takes several minutes for "
        "1M users. Prints a table, or one JSON object as the last line with --json; also "
        "writes bench/results/<timestamp>.json and a PNG plot.",
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
        help="sending workers started for the campaign (default: %(default)s)",
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
        "--limiter-seconds",
        type=float,
        default=20.0,
        help="how long each limiter run (600/s, then 3,000/s) sends (default: %(default)s)",
    )
    p.add_argument(
        "--pauses",
        type=int,
        default=10,
        help="pause/resume cycles timed for pause_latency_ms (default: %(default)s)",
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
    from flashsend.bench import BenchOptions, run_bench

    result = run_bench(
        load_settings(),
        BenchOptions(
            users=args.users,
            workers=args.workers,
            ses_latency_ms=args.ses_latency_ms,
            naive_users=args.naive_users,
            limiter_seconds=args.limiter_seconds,
            pauses=args.pauses,
            out_dir=args.out,
        ),
    )
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"  {key:<24} {value}")
    return 0
