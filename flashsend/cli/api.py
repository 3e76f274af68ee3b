"""`flashsend api` (serve, openapi), `flashsend api-key create|list|revoke`,
`flashsend audience add|list`, `flashsend audit`."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from flashsend.errors import UsageError
from flashsend.settings import Settings, load_settings
from sinks.audit_store import Actor


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "api",
        help="the Campaign HTTP API (flashsend up starts it); `api openapi` prints its document",
        description="Serves /api/v1/… (docs/api.md), /healthz, /readyz and /metrics. Example: "
        "flashsend api --port 14568; flashsend api openapi > docs/api/openapi.json",
    )
    p.add_argument("--host", default=None, help="default FLASHSEND_API_HOST (127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="default FLASHSEND_API_PORT (14568)")
    p.set_defaults(func=cmd_serve)
    asub = p.add_subparsers(dest="api_cmd", required=False, metavar="ACTION")
    o = asub.add_parser("openapi", help="print the OpenAPI document (JSON) the API serves")
    o.set_defaults(func=cmd_openapi)
    b = asub.add_parser(
        "bench",
        help="the API's figures during a campaign at full speed on the local stack",
        description="GET campaign median/p99, SSE listeners (the API process's CPU per "
        "listener per second), pause through the API → the last recipient SES accepted. "
        "Needs the local stack (flashsend up). Example: flashsend api bench --users 200000 "
        "--json",
    )
    b.add_argument("--users", type=int, default=1_000_000, help="recipients (default 1M)")
    b.add_argument("--workers", type=int, default=2)
    b.add_argument("--gets", type=int, default=500, help="GET requests timed")
    b.add_argument("--listeners", type=int, default=200, help="event streams held at once")
    b.add_argument("--sse-seconds", type=float, default=10.0)
    b.add_argument("--rate", type=float, default=0.0, help="campaign limit (default 0: full speed)")
    b.add_argument("--json", action="store_true", help="one JSON object on stdout")
    b.set_defaults(func=cmd_bench)

    keys = sub.add_parser("api-key", help="API keys of the HTTP API (admin)")
    ksub = keys.add_subparsers(dest="key_cmd", required=True, metavar="ACTION")
    c = ksub.add_parser(
        "create",
        help="create a key; printed once (only its hash is kept)",
        description="Roles: viewer (read), operator (start, pause, resume, cancel, promote, "
        "release), admin (everything: create, retire, resend-unknown, audiences). Example: "
        "flashsend api-key create --name airflow --role operator --expires 90d",
    )
    c.add_argument("--name", required=True, help="who uses it (shown in the audit log)")
    c.add_argument("--role", required=True, choices=("viewer", "operator", "admin"))
    c.add_argument("--expires", default=None, metavar="DURATION", help="e.g. 90d, 12h")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_key_create)
    c = ksub.add_parser("list", help="keys: name, prefix, role, expiry, revoked")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_key_list)
    c = ksub.add_parser("revoke", help="revoke a key by name or prefix (from the next request)")
    c.add_argument("key", metavar="NAME|PREFIX")
    c.set_defaults(func=cmd_key_revoke)

    aud = sub.add_parser("audience", help="named audiences an API request may use")
    bsub = aud.add_subparsers(dest="audience_cmd", required=True, metavar="ACTION")
    c = bsub.add_parser(
        "add",
        help="register NAME = an SQL condition over users u",
        description='An API request names an audience ("audience": "vip"); it never '
        "sends SQL. Example: flashsend audience add vip --where \"u.status = 'active' AND "
        'u.marketing_opt_in AND u.id % 10 = 0"',
    )
    c.add_argument("name")
    c.add_argument("--where", required=True, help="SQL condition over users u")
    c.set_defaults(func=cmd_audience_add)
    c = bsub.add_parser("list", help="registered audiences")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_audience_list)

    c = sub.add_parser(
        "audit",
        help="who changed what: API keys and command line users, newest first",
        description="Every state-changing command and API request is written with the "
        "change: who (the API key's name or cli:<user>), the state before and after, the "
        "request id and the source. Example: flashsend audit --campaign 42",
    )
    c.add_argument("--campaign", type=int, default=None)
    c.add_argument("--limit", type=int, default=100)
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_audit)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from flashsend.api.app import create_app
    from flashsend.logs import configure

    settings = load_settings()
    configure(settings.log_format)
    host = args.host or settings.api_host
    port = settings.api_port if args.port is None else args.port
    print(f"flashsend api on http://{host}:{port}", file=sys.stderr, flush=True)
    uvicorn.run(create_app(settings), host=host, port=port, log_level="warning")
    return 0


def openapi_document(settings: Settings | None = None) -> str:
    from flashsend.api.app import create_app

    app = create_app(settings or load_settings())
    return json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"


def cmd_openapi(args: argparse.Namespace) -> int:
    sys.stdout.write(openapi_document())
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from flashsend.cli.lab_result import print_result, progress_log
    from flashsend.lab.api_bench import ApiBenchOptions, run_api_bench
    from flashsend.lab.run import sigterm_interrupts

    options = ApiBenchOptions(
        users=args.users,
        workers=args.workers,
        gets=args.gets,
        listeners=args.listeners,
        sse_seconds=args.sse_seconds,
        rate=args.rate,
    )
    with sigterm_interrupts():
        result = run_api_bench(load_settings(), options, progress_log(args))
    print_result(args, result, 32)
    return 1 if "error" in result else 0


def _connect(settings: Settings) -> psycopg.Connection[Any]:
    return psycopg.connect(settings.pg_dsn, autocommit=True)


def parse_expiry(text: str | None, now: datetime) -> datetime | None:
    if text is None:
        return None
    from streams.rules.ab_test import parse_duration

    seconds = parse_duration(text)
    if seconds <= 0:
        raise UsageError(f"--expires {text!r} must be in the future")
    return now + timedelta(seconds=seconds)


def cmd_key_create(args: argparse.Namespace) -> int:
    from flashsend.api.key_admin import create_key

    settings = load_settings()
    expires = parse_expiry(args.expires, datetime.now(UTC))
    key, prefix = create_key(settings, args.name, args.role, expires, Actor.cli(settings.operator))
    if args.json:
        print(
            json.dumps(
                {
                    "name": args.name,
                    "role": args.role,
                    "prefix": prefix,
                    "key": key,
                    "expires_at": expires.isoformat() if expires else None,
                }
            )
        )
    else:
        print(key)
        print(
            f"API key {args.name!r} ({args.role}, prefix {prefix}"
            f"{', expires ' + expires.isoformat() if expires else ''}): shown once, keep it",
            file=sys.stderr,
        )
    return 0


def cmd_key_list(args: argparse.Namespace) -> int:
    from sinks.api_key_store import ApiKeyStore

    with _connect(load_settings()) as conn:
        keys = ApiKeyStore(conn).keys()
    if args.json:
        print(json.dumps(keys))
        return 0
    for k in keys:
        state = "revoked " + k["revoked_at"] if k["revoked_at"] else "usable"
        print(
            f"{k['name']:<24} {k['prefix']:<10} {k['role']:<9} expires "
            f"{k['expires_at'] or 'never':<33} {state}"
        )
    return 0


def cmd_key_revoke(args: argparse.Namespace) -> int:
    from sinks.api_key_store import ApiKeyStore

    settings = load_settings()
    with _connect(settings) as conn:
        key = ApiKeyStore(conn).revoke(args.key, Actor.cli(settings.operator))
    print(f"API key {key['name']!r} (prefix {key['prefix']}) revoked")
    return 0


def cmd_audience_add(args: argparse.Namespace) -> int:
    from sinks.api_key_store import ApiKeyStore

    settings = load_settings()
    with _connect(settings) as conn:
        ApiKeyStore(conn).add_audience(args.name, args.where, Actor.cli(settings.operator))
    print(f"audience {args.name!r} registered")
    return 0


def cmd_audience_list(args: argparse.Namespace) -> int:
    from sinks.api_key_store import ApiKeyStore

    with _connect(load_settings()) as conn:
        rows = ApiKeyStore(conn).audiences()
    if args.json:
        print(json.dumps(rows))
        return 0
    for r in rows:
        print(f"{r['name']:<24} {r['condition']}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from sinks.audit_store import read_audit

    with _connect(load_settings()) as conn:
        rows = read_audit(conn, campaign_id=args.campaign, limit=args.limit)
    if args.json:
        print(json.dumps(rows))
        return 0
    for r in rows:
        change = f"{r['state_before'] or '-'} → {r['state_after'] or '-'}"
        print(
            f"#{r['id']:<6} {r['created_at']}  {r['actor']:<20} {r['action']:<16} "
            f"campaign {r['campaign_id'] or '-':<10} {change:<22} {r['source'] or ''}"
        )
    return 0
