"""`flashsend docs cli`: writes docs/cli.md, the command reference, from the argparse
definitions, so `--help` and the reference cannot disagree (a unit test fails when the file
differs from what this writes)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
REGENERATE = "flashsend docs cli  (or: make docs)"
# A fixed width: the reference must not depend on the terminal that wrote it.
WIDTH = 100

HEADER = """\
# Command reference

Every `flashsend` command's `--help`, as the command prints it. Generated from the argparse
definitions in `flashsend/cli/` by `flashsend docs cli` (or `make docs`): do not edit by hand,
change the command's help text and regenerate; `tests/unit/test_cli_docs.py` fails when this
file is stale.

All commands read their settings from `FLASHSEND_*` environment variables
([settings.md](settings.md)). With `--json` a command's stdout is its JSON alone (progress
goes to stderr), so `flashsend demo --json | jq .sent` works.
"""


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    build_parser: Callable[[], argparse.ArgumentParser],
) -> None:
    """The `docs` commands; `build_parser` gives the whole command line (entry passes its own:
    this module does not import entry)."""
    p = sub.add_parser(
        "docs",
        help="regenerate generated documentation (docs/cli.md)",
        description="Writes documentation that is generated from the code.",
    )
    docs_sub = p.add_subparsers(dest="docs_command", metavar="WHAT", required=True)
    c = docs_sub.add_parser(
        "cli",
        help="write docs/cli.md from the argparse definitions",
        description="Writes every command's and subcommand's --help (usage, description, "
        "options) to docs/cli.md. Run it after changing a command's arguments or help text.",
    )
    c.add_argument(
        "--output", type=Path, default=CLI_DOC, help="where to write (default: docs/cli.md)"
    )
    c.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when the file differs from what would be written",
    )
    c.set_defaults(func=lambda args: cmd_docs_cli(args, build_parser()))


def cmd_docs_cli(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    text = cli_reference(parser)
    output: Path = args.output
    if args.check:
        current = output.read_text() if output.exists() else ""
        if current != text:
            print(f"{output} is stale: run {REGENERATE}")
            return 1
        print(f"{output} is up to date")
        return 0
    output.write_text(text)
    print(f"wrote {output}")
    return 0


def cli_reference(parser: argparse.ArgumentParser) -> str:
    """docs/cli.md as the parser (entry.build_parser()) gives it."""
    commands = list(_walk(parser, depth=0))
    out = [HEADER, "## Commands", ""]
    for name, summary, depth, _ in commands:
        if depth == 0:
            continue
        indent = "  " * (depth - 1)
        out.append(f"{indent}- [`{name}`](#{_slug(name)}){' — ' + summary if summary else ''}")
    out.append("")
    for name, _, depth, sub in commands:
        level = "#" * min(max(depth + 1, 2), 4)
        out += [f"{level} {name}", "", "```text", _help(sub).rstrip(), "```", ""]
    return "\n".join(out).rstrip() + "\n"


def _walk(
    parser: argparse.ArgumentParser, depth: int, summary: str = ""
) -> Iterator[tuple[str, str, int, argparse.ArgumentParser]]:
    yield parser.prog, summary, depth, parser
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        seen: set[int] = set()
        for name, child in action.choices.items():
            if id(child) in seen:  # an alias
                continue
            seen.add(id(child))
            yield from _walk(child, depth + 1, " ".join(helps.get(name, "").split()))


def _help(parser: argparse.ArgumentParser) -> str:
    """The parser's --help at WIDTH columns, whatever the terminal."""
    original: Any = parser.formatter_class

    def fixed(prog: str) -> argparse.HelpFormatter:
        formatter: argparse.HelpFormatter = original(prog=prog, width=WIDTH)
        return formatter

    parser.formatter_class = fixed
    try:
        return parser.format_help()
    finally:
        parser.formatter_class = original


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    kept = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")
