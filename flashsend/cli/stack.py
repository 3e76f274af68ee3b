"""Local stack commands: setup, up, down, status-stack, migrate."""

from __future__ import annotations

import argparse
import json
from typing import Any

from flashsend.settings import Settings, load_settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("setup", help="check prerequisites and fetch the Kafka jars (idempotent)")
    p.set_defaults(func=cmd_setup)
    p = sub.add_parser(
        "up",
        help="start the local stack and apply migrations (idempotent)",
        description="Starts the services in FLASHSEND_LOCAL_SERVICES (state in "
        "FLASHSEND_STATE_DIR). SNS events the SES stand-in had not delivered when it stopped "
        "are dropped unless --resume-ses-events (or FLASHSEND_SES_RESUME_EVENTS=true) is given.",
    )
    p.add_argument(
        "--resume-ses-events",
        action="store_true",
        help="the SES stand-in keeps its undelivered SNS events at stop and sends them after "
        "its next start (default: dropped)",
    )
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("down", help="stop the local stack (data is kept in the state dir)")
    p.set_defaults(func=cmd_down)
    p = sub.add_parser("status-stack", help="show which local services answer, and where")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("migrate", help="apply pending SQL migrations (infra/migrations)")
    p.set_defaults(func=cmd_migrate)


def cmd_setup(args: argparse.Namespace) -> int:
    from infra.kafka import ensure_jars, kafka_version, require_java

    settings = load_settings()
    require_java()
    libs = ensure_jars(settings)
    print(f"java ok; kafka {kafka_version()} jars in {libs}")
    if "registry" in settings.local_services:  # operations
        from infra.errors import PrerequisiteMissing
        from infra.registry import ensure_app, find_java, registry_version

        try:
            java = find_java(settings.registry_java)
        except PrerequisiteMissing as exc:  # the rest of the stack works without it
            print(f"warning: {exc}")
            return 0
        jar = ensure_app(settings)
        print(f"schema registry: apicurio {registry_version()} in {jar.parent} (java: {java})")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from infra.stack import Stack

    settings = load_settings()
    if args.resume_ses_events:
        settings = settings.model_copy(update={"ses_resume_events": True})
    print(f"flashsend stack in {settings.state_dir}")
    timings = Stack(settings).up()
    print("endpoints:")
    print(f"  kafka     {settings.kafka_bootstrap}")
    print(f"  postgres  {settings.pg_dsn}")
    print(f"  ses       {settings.ses_endpoint_url or 'real Amazon SES'}")
    print(f"  registry  {settings.schema_registry_url}")
    if "sqs" in settings.local_services:
        print(f"  sqs       {settings.sqs_endpoint_url} (queue {settings.sqs_queue})")
    if "api" in settings.local_services:
        print(
            f"  api       http://127.0.0.1:{settings.api_port}/api/v1 "
            "(a key: flashsend api-key create --name me --role admin)"
        )
        key = console_key(settings)
        print(f"  console   http://127.0.0.1:{settings.api_port}/  (sign in with {key})")
    print(f"start seconds: {json.dumps(timings)}")
    return 0


CONSOLE_KEY_HOURS = 24


def console_key(settings: Settings) -> str:
    """A new admin key for the local console, valid CONSOLE_KEY_HOURS: a key is shown only
    when made, so each `flashsend up` makes one (`api-key list` shows them, `revoke` ends one)."""
    from datetime import UTC, datetime, timedelta

    from flashsend.api.key_admin import create_key
    from sinks.audit_store import Actor

    now = datetime.now(UTC)
    name = f"console-{now:%Y%m%d-%H%M%S}"
    expires = now + timedelta(hours=CONSOLE_KEY_HOURS)
    key, _ = create_key(settings, name, "admin", expires, Actor.cli(settings.operator))
    return f"{key}, valid {CONSOLE_KEY_HOURS} h"


def cmd_down(args: argparse.Namespace) -> int:
    from infra.stack import Stack

    stopped = Stack(load_settings()).down()
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from infra.stack import Stack

    statuses = Stack(load_settings()).status()
    if args.json:
        out: dict[str, Any] = {s.name: {"up": s.running, "endpoint": s.endpoint} for s in statuses}
        print(json.dumps(out))
    else:
        for s in statuses:
            print(f"  {s.name:<9} {'up  ' if s.running else 'down'}  {s.endpoint}")
    return 0 if all(s.running for s in statuses) else 1


def cmd_migrate(args: argparse.Namespace) -> int:
    from infra.migrate import apply_migrations

    applied = apply_migrations(load_settings().pg_dsn)
    print(
        f"{len(applied)} migration(s) applied"
        + "".join(f"\n  {m.version:04d} {m.name}" for m in applied)
    )
    return 0
