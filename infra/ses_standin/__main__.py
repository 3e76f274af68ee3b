"""Command line: `python -m infra.ses_standin --host 127.0.0.1 --port PORT --state-dir DIR`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from flashsend import gc_pauses
from infra.ses_standin.account import SesAccount
from infra.ses_standin.emission import EventEmission
from infra.ses_standin.faults import FaultConfig
from infra.ses_standin.server import build_app
from infra.ses_standin.sqs_sink import SqsSink

log = logging.getLogger("infra.ses_standin")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m infra.ses_standin", description="Local Amazon SESv2 stand-in."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4579, help="0 picks a free port")
    parser.add_argument("--state-dir", type=Path, required=True, help="journal + templates")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--p429", type=float, default=0.0, help="per send call")
    parser.add_argument("--p-transient", type=float, default=0.0, help="per bulk entry")
    parser.add_argument("--p-hang", type=float, default=0.0, help="per send call")
    parser.add_argument(
        "--max-send-rate", type=float, default=0.0, help="recipients/s; <= 0 unlimited"
    )
    parser.add_argument(
        "--max-24h-send", type=float, default=-1.0, help="recipients/24 h; <= 0 unlimited"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed for fault draws")
    parser.add_argument(
        "--resume-events",
        action="store_true",
        help="keep the SNS events not yet delivered at stop and send them after the next start "
        "(default: dropped at stop)",
    )
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> FaultConfig:
    return FaultConfig().updated(
        {
            "latency_ms": args.latency_ms,
            "jitter_ms": args.jitter_ms,
            "p429": args.p429,
            "p_transient": args.p_transient,
            "p_hang": args.p_hang,
            "max_send_rate": args.max_send_rate,
            "max_24h_send": args.max_24h_send,
        }
    )


async def serve(args: argparse.Namespace) -> None:
    account = SesAccount(args.state_dir, config_from_args(args), seed=args.seed)
    # Event publishing: SES events as signed SNS POSTs to subscribed webhooks, and in batches
    # to the Firehose delivery streams of the configuration sets' event destinations.
    emission = EventEmission(args.state_dir / "events", resume_backlog=args.resume_events)
    account.on_accepted.append(emission.on_accepted)
    emission.attach_firehose(account.configuration_sets, account.firehose)
    account.sms.on_text.append(emission.on_text_accepted)
    account.sms.on_inbound.append(emission.on_inbound)
    account.push.on_event.append(emission.on_inbound)  # push delivery failures: same path
    sqs_sink = SqsSink.beside(emission, args.state_dir / "events")  # the same events into SQS
    account.on_accepted.append(sqs_sink.on_accepted)
    app = build_app(account)
    emission.register(app)
    sqs_sink.register(app)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, backlog=1024, shutdown_timeout=1.0)
    await site.start()
    host, port = runner.addresses[0][:2]
    await emission.start(f"http://{host}:{port}")
    await sqs_sink.start()
    log.info("ses_standin_ready url=http://%s:%s state_dir=%s", host, port, args.state_dir)
    # One machine-readable line on stdout, for launchers that pass --port 0.
    print(f"ses-standin listening on http://{host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        account.close()
        log.info("ses_standin_stopped")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    gc_pauses.install()  # its message index grows all run: full passes would stall calls
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
