"""docs/cli.md is what `flashsend docs cli` writes from the argparse definitions now, so the
reference and `--help` cannot disagree; and it names every command."""

from __future__ import annotations

import argparse
import difflib

import pytest

from flashsend.cli.docs import CLI_DOC, REGENERATE, cli_reference
from flashsend.cli.entry import build_parser


def test_docs_cli_md_is_what_the_parser_gives() -> None:
    expected = cli_reference(build_parser())
    committed = CLI_DOC.read_text() if CLI_DOC.exists() else ""
    if committed != expected:
        diff = "".join(
            list(
                difflib.unified_diff(
                    committed.splitlines(keepends=True),
                    expected.splitlines(keepends=True),
                    "docs/cli.md (committed)",
                    "docs/cli.md (from the parser)",
                )
            )[:40]
        )
        raise AssertionError(f"docs/cli.md is stale; regenerate it: {REGENERATE}\n{diff}")


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    found = [parser.prog]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                found += _commands(child)
    return found


def test_every_command_has_a_section() -> None:
    text = cli_reference(build_parser())
    for command in _commands(build_parser()):
        assert f"# {command}\n" in text, command


def test_the_reference_does_not_depend_on_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    narrow = cli_reference(build_parser())
    monkeypatch.setenv("COLUMNS", "200")
    assert cli_reference(build_parser()) == narrow
