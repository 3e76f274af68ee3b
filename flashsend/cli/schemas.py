"""`flashsend schemas check|register` — Avro contracts against their history and the registry."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flashsend.errors import FlashsendError
from flashsend.settings import load_settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("schemas", help="Avro contracts: compatibility check, registration")
    ssub = p.add_subparsers(dest="schemas_cmd", required=True)
    c = ssub.add_parser(
        "check",
        help="fail on an incompatible contract change (offline and/or against the registry)",
        description="Offline: every released <name>.v<N>.avsc against its fingerprint in the "
        "committed released.json (released versions are immutable: an in-place edit fails, "
        "even committed), every version against the earlier versions, and every file against "
        "its own content in git (uncommitted edits). Online: the latest file of each contract "
        "against the registry's latest version of its subject (compatibility endpoint). Exit "
        "1 on any incompatible change. CI runs `flashsend schemas check --offline`.\n\n"
        "  flashsend schemas check --offline\n"
        "  flashsend schemas check --against origin/main",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("--offline", action="store_true", help="no registry: files and git only")
    c.add_argument("--against", default="HEAD", help="git revision for the offline check")
    c.add_argument("--no-git", action="store_true", help="skip the comparison with git")
    c.add_argument("--level", default=None, help="default FLASHSEND_SCHEMA_COMPATIBILITY")
    c.add_argument("--dir", type=Path, default=None, help="schema directory (tests)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_check)
    lk = ssub.add_parser(
        "lock",
        help="record the fingerprints of new contract versions in released.json",
        description="Adds every <name>.v<N>.avsc not yet in released.json (next to the files) "
        "and never changes a recorded fingerprint: a released version is immutable. Commit "
        "released.json with the new file.\n\n  flashsend schemas lock",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    lk.add_argument("--dir", type=Path, default=None, help="schema directory (tests)")
    lk.set_defaults(func=cmd_lock)
    r = ssub.add_parser(
        "register",
        help="set each subject's compatibility level and register every version in order",
    )
    r.add_argument("--level", default=None, help="default FLASHSEND_SCHEMA_COMPATIBILITY")
    r.add_argument("--dir", type=Path, default=None)
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_register)


def cmd_check(args: argparse.Namespace) -> int:
    from schemas.contracts import CheckResult, check_offline, check_registry
    from schemas.serde import SCHEMA_DIR, registry_client

    settings = load_settings()
    level = (args.level or settings.schema_compatibility).upper()
    directory = args.dir or SCHEMA_DIR
    from schemas.released import LOCK_FILE

    results: list[CheckResult] = check_offline(
        level, directory, None if args.no_git else args.against, lock=directory / LOCK_FILE
    )
    if not args.offline:
        url = settings.schema_registry_url
        if url.startswith("mock://"):
            print(f"note: {url} is in-process and empty; checking offline only")
        else:
            try:
                results += check_registry(registry_client(url), level, directory)
            except Exception as exc:  # httpx / registry client errors: one line, no trace
                raise FlashsendError(f"schema registry at {url} not usable: {exc}") from exc
    failed = [r for r in results if not r.ok]
    if args.json:
        print(
            json.dumps(
                {"level": level, "ok": not failed, "results": [r.as_dict() for r in results]}
            )
        )
    else:
        for r in results:
            print(f"  {'ok  ' if r.ok else 'FAIL'} {r.file} vs {r.against}")
            for problem in r.problems:
                print(f"         {problem}")
        count = len(list(directory.glob("*.avsc")))
        print(
            f"{count} schema file(s), level {level}: "
            + (f"{len(failed)} incompatible change(s)" if failed else "compatible")
        )
    return 1 if failed else 0


def cmd_register(args: argparse.Namespace) -> int:
    from schemas.contracts import register_all
    from schemas.serde import SCHEMA_DIR, registry_client

    settings = load_settings()
    level = (args.level or settings.schema_compatibility).upper()
    done = register_all(
        registry_client(settings.schema_registry_url), level, args.dir or SCHEMA_DIR
    )
    if args.json:
        print(json.dumps({"level": level, "registered": done}))
    else:
        for d in done:
            print(f"  {d['subject']:<40} id {d['id']:<5} {d['file']}")
        print(
            f"{len(done)} version(s) registered at {settings.schema_registry_url} "
            f"(subject level {level})"
        )
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    from schemas.released import LOCK_FILE, lock_directory
    from schemas.serde import SCHEMA_DIR

    directory = args.dir or SCHEMA_DIR
    added = lock_directory(directory)
    for name in added:
        print(f"  released {name}")
    print(f"{len(added)} new version(s) recorded in {directory / LOCK_FILE}")
    return 0
