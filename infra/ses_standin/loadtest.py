"""Throughput check: SendBulkEmail calls of 50 entries against a running stand-in.

    python -m infra.ses_standin.loadtest --url http://127.0.0.1:PORT --server-pid PID \
        --processes 2 --threads 4 --seconds 10

Each process runs `threads` threads, each with its own boto3 sesv2 client (retries off,
parameter validation off, as the sender uses it). `--raw` replaces boto3 with a plain
keep-alive HTTP client sending the same JSON body, to measure the server without the client's
~3–4 ms of CPU per call. Reports calls/s, recipients/s and the server's CPU use (from
/proc/PID/stat) so the cost per call can be compared with one core.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import threading
import time
import urllib.parse
from typing import Any

from infra.ses_standin.admin import SesStandinAdmin

ENTRIES = 50
TEMPLATE = "loadtest"


def bulk_params(call: int, worker: str, campaign: str) -> dict[str, Any]:
    return {
        "FromEmailAddress": "shop@example.com",
        "DefaultContent": {
            "Template": {"TemplateName": TEMPLATE, "TemplateData": json.dumps({"shop": "X"})}
        },
        "DefaultEmailTags": [{"Name": "campaign", "Value": campaign}],
        "BulkEmailEntries": [
            {
                "Destination": {"ToAddresses": [f"u{worker}-{call}-{i}@example.com"]},
                "ReplacementEmailContent": {
                    "ReplacementTemplate": {
                        "ReplacementTemplateData": json.dumps({"name": f"User {i}"})
                    }
                },
                "ReplacementTags": [{"Name": "seq", "Value": str(call * ENTRIES + i)}],
                "ReplacementHeaders": [
                    {"Name": "List-Unsubscribe", "Value": f"<https://x.invalid/u/{i}>"}
                ],
            }
            for i in range(ENTRIES)
        ],
    }


def _boto_worker(url: str, worker: str, campaign: str, deadline: float, out: list[int]) -> None:
    import boto3  # imported here: only this mode needs it
    from botocore.config import Config

    client = boto3.client(
        "sesv2",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=Config(retries={"max_attempts": 1}, parameter_validation=False),
    )
    calls = 0
    while time.time() < deadline:
        client.send_bulk_email(**bulk_params(calls, worker, campaign))
        calls += 1
    out.append(calls)


def _raw_worker(url: str, worker: str, campaign: str, deadline: float, out: list[int]) -> None:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80)
    calls = 0
    while time.time() < deadline:
        body = json.dumps(bulk_params(calls, worker, campaign)).encode()
        conn.request(
            "POST",
            "/v2/email/outbound-bulk-emails",
            body,
            {"Content-Type": "application/json"},
        )
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")
        calls += 1
    out.append(calls)


def _process(url: str, index: int, threads: int, raw: bool, deadline: float, campaign: str) -> int:
    target = _raw_worker if raw else _boto_worker
    out: list[int] = []
    pool = [
        threading.Thread(target=target, args=(url, f"{index}x{t}", campaign, deadline, out))
        for t in range(threads)
    ]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return sum(out)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--server-pid", type=int, required=True)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--raw", action="store_true")
    args = parser.parse_args()

    admin = SesStandinAdmin(args.url)
    admin.wait_ready(10)
    admin.ensure_template(TEMPLATE, subject="Hi {{name}} from {{shop}}", text="Hello {{name}}")
    campaign = f"load{int(time.time())}"
    cpu_before = _cpu_seconds(args.server_pid)
    started = time.time()
    deadline = started + args.seconds
    with multiprocessing.Pool(args.processes) as pool:
        counts = pool.starmap(
            _process,
            [
                (args.url, p, args.threads, args.raw, deadline, campaign)
                for p in range(args.processes)
            ],
        )
    elapsed = time.time() - started
    cpu = _cpu_seconds(args.server_pid) - cpu_before
    calls = sum(counts)
    stats = admin.stats(campaign)
    print(
        json.dumps(
            {
                "mode": "raw-http" if args.raw else "boto3",
                "processes": args.processes,
                "threads": args.threads,
                "seconds": round(elapsed, 2),
                "calls": calls,
                "calls_per_s": round(calls / elapsed, 1),
                "recipients_per_s": round(calls * ENTRIES / elapsed, 1),
                "server_cpu_s": round(cpu, 2),
                "server_cpu_share_of_one_core": round(cpu / elapsed, 2),
                "server_cpu_ms_per_call": round(1000 * cpu / max(calls, 1), 3),
                "server_calls_per_cpu_s": round(calls / cpu, 1) if cpu else None,
                "accepted": stats["accepted"],
            }
        )
    )


if __name__ == "__main__":
    main()
