"""`flashsend push setup|register`: the platform applications push campaigns publish through,
and a device's registration (docs/push.md)."""

from __future__ import annotations

import argparse
import json

import psycopg

from flashsend.settings import load_settings
from producers.push_setup import PLATFORMS, ensure_applications
from producers.push_setup import register as register_device


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "push",
        help="mobile push: platform applications and device endpoints (SNS)",
        description="setup: CreatePlatformApplication for FCM and APNs (names "
        "FLASHSEND_PUSH_APPLICATION_FCM/_APNS; delivery failures go to the first of "
        "FLASHSEND_SNS_TOPIC_ARNS, which the webhook subscribes). register: CreatePlatformEndpoint "
        "of a device's token and its row in device_endpoints (registering a token again "
        "enables it again). Example: flashsend push register --user 42 --platform FCM --token "
        "fcm-token-of-the-phone",
    )
    verbs = p.add_subparsers(dest="verb", required=True)
    verbs.add_parser("setup", help="create (or find) the platform applications").set_defaults(
        func=cmd_setup
    )
    r = verbs.add_parser("register", help="register a device token for a user")
    r.add_argument("--user", type=int, required=True, help="users.id")
    r.add_argument("--platform", choices=PLATFORMS, required=True)
    r.add_argument("--token", required=True, help="the device token the app got from FCM/APNs")
    r.set_defaults(func=cmd_register)


def cmd_setup(args: argparse.Namespace) -> int:
    print(json.dumps(ensure_applications(load_settings())))
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    settings = load_settings()
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row_id, arn = register_device(settings, conn, args.user, args.platform, args.token)
    print(json.dumps({"id": row_id, "endpoint_arn": arn}))
    return 0
