"""The OpenAPI document the API serves is the one committed (regenerate it with `flashsend
api openapi > docs/api/openapi.json`), and every command that changes a campaign has its
endpoint."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flashsend.api.app import create_app
from flashsend.cli.api import openapi_document
from flashsend.cli.entry import build_parser
from flashsend.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "api" / "openapi.json"
# Campaign commands that only read, with the GET that serves the same.
READS = {
    "status": "/api/v1/campaigns/{campaign_id}",
    "report": "/api/v1/campaigns/{campaign_id}/report",
}
# Commands that change a campaign but are no operator's transition: the workers run it.
NOT_OPERATIONS = {"reconcile"}


def _served() -> dict[str, object]:
    return create_app(Settings()).openapi()


def test_the_served_document_is_the_committed_one() -> None:
    committed = json.loads(COMMITTED.read_text())
    assert _served() == committed, (
        "docs/api/openapi.json is stale: flashsend api openapi > docs/api/openapi.json"
    )
    assert openapi_document(Settings()) == COMMITTED.read_text()


def _campaign_commands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    campaign = sub.choices["campaign"]
    csub = next(a for a in campaign._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(csub.choices)


def missing_endpoints(commands: list[str], paths: dict[str, dict[str, object]]) -> list[str]:
    missing = []
    for command in commands:
        if command in NOT_OPERATIONS:
            continue
        if command in READS:
            ok = "get" in paths.get(READS[command], {})
        elif command == "create":
            ok = "post" in paths.get("/api/v1/campaigns", {})
        else:
            ok = "post" in paths.get(f"/api/v1/campaigns/{{campaign_id}}/{command}", {})
        if not ok:
            missing.append(command)
    return missing


def _paths() -> dict[str, dict[str, object]]:
    paths = _served()["paths"]
    assert isinstance(paths, dict)
    return paths


def test_every_command_that_changes_a_campaign_has_an_endpoint() -> None:
    commands = _campaign_commands()
    assert {"pause", "resume", "cancel", "start", "promote", "release", "retire"} <= set(commands)
    assert missing_endpoints(commands, _paths()) == []


def test_a_new_command_without_an_endpoint_fails_the_check() -> None:
    assert missing_endpoints([*_campaign_commands(), "frobnicate"], _paths()) == ["frobnicate"]
