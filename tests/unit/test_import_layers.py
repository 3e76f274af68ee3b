"""The packages' imports, read from the source: no cycles, and the layers point one way.

- The pipeline (producers, streams, sinks, schemas) never imports the command line, the lab
  or the SES stand-in: it ships, they do not.
- A module is pure when neither it nor anything of ours it imports uses an I/O library
  (Faust, Kafka, PostgreSQL, boto3, asyncio). streams/rules/ holds the pure decision modules
  and nothing else; every other streams module is an agent or its I/O, so a name tells rule
  from agent.
- Stores (sinks) use only the rules of streams, never the agents.
- The ground (the modules directly in flashsend/: settings, logs, metrics, deliverability, …)
  imports no store and no agent: every layer may use it.
- Nothing but the lab and the local stack imports the SES stand-in (the local stack includes
  `flashsend aws plan|apply`'s local mode, where the stand-in plays SNS).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("flashsend", "producers", "streams", "sinks", "schemas", "infra")
PIPELINE = ("producers", "streams", "sinks", "schemas")
CLI = ("flashsend.cli",)
LAB = ("flashsend.lab",)
STANDIN = "infra.ses_standin"
RULES = "streams.rules"
IO_LIBRARIES = (
    "faust",
    "mode",
    "aiokafka",
    "confluent_kafka",
    "psycopg",
    "psycopg_pool",
    "boto3",
    "botocore",
    "asyncio",
)


def module_files(root: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported_names(path: Path) -> Iterator[str]:
    """Every absolute import of the file, at any depth (a lazy import still couples)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def import_graph(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> our modules it imports, module -> top-level third-party names)."""
    files = module_files(root)
    ours: dict[str, set[str]] = {m: set() for m in files}
    theirs: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        for name in imported_names(path):
            target = name
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != module:
                ours[module].add(target)
            elif not target and name.split(".")[0] not in PACKAGES:
                theirs[module].add(name.split(".")[0])
    return ours, theirs


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def within(module: str, prefixes: tuple[str, ...] | str) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def impure(ours: dict[str, set[str]], theirs: dict[str, set[str]]) -> set[str]:
    """Modules that use an I/O library, themselves or through any module of ours they import."""
    found = {m for m in ours if theirs[m] & set(IO_LIBRARIES)}
    grew = True
    while grew:
        more = {m for m, targets in ours.items() if m not in found and targets & found}
        found |= more
        grew = bool(more)
    return found


def is_ground(module: str) -> bool:
    return (
        module.count(".") == 1
        and within(module, "flashsend")
        and not within(module, ("flashsend.cli", "flashsend.lab", "flashsend.api"))
    )


def violations(ours: dict[str, set[str]], theirs: dict[str, set[str]]) -> list[str]:
    doing_io = impure(ours, theirs)
    found = [f"import cycle: {' <-> '.join(c)}" for c in cycles(ours)]
    for module in sorted(m for m in ours if within(m, "streams") and m not in ("streams", RULES)):
        if within(module, RULES) and module in doing_io:
            found.append(f"a rule does I/O: {module}")
        if not within(module, RULES) and module not in doing_io:
            found.append(f"a pure module outside streams/rules: {module}")
    for module, targets in sorted(ours.items()):
        for target in sorted(targets):
            if within(module, PIPELINE) and within(target, CLI + LAB):
                found.append(f"pipeline imports the command line or the lab: {module} -> {target}")
            if within(module, "sinks") and within(target, "streams") and not within(target, RULES):
                found.append(f"a store imports an agent: {module} -> {target}")
            if is_ground(module) and (
                within(target, "sinks") or (within(target, "streams") and not within(target, RULES))
            ):
                found.append(f"the ground imports a store or an agent: {module} -> {target}")
            if within(target, STANDIN) and not within(
                module, (STANDIN, *LAB, "infra.stack", "infra.webhook_service", "infra.aws_apply")
            ):
                found.append(f"product code imports the SES stand-in: {module} -> {target}")
    return found


GRAPH = import_graph(ROOT)


def test_the_tree_has_no_cycle_and_its_layers_point_one_way() -> None:
    assert violations(*GRAPH) == []


@pytest.mark.parametrize(
    ("module", "target", "expected"),
    [
        ("sinks.recipient_store", "streams.sender", "a store imports an agent"),
        ("streams.rules.throttle", "flashsend.cli.campaign", "pipeline imports"),
        ("producers.campaign", "flashsend.lab", "pipeline imports"),
        ("producers.campaign", "infra.ses_standin.admin", "SES stand-in"),
        ("sinks.offsets", "sinks.recipient_store", "import cycle"),
        ("flashsend.deliverability", "sinks.recipient_store", "the ground imports a store"),
        ("flashsend.settings", "streams.sender", "the ground imports a store or an agent"),
        ("streams.rules.throttle", "sinks.recipient_store", "a rule does I/O"),
    ],
)
def test_each_rule_fails_when_broken(module: str, target: str, expected: str) -> None:
    ours = {m: set(targets) for m, targets in GRAPH[0].items()}
    ours.setdefault(target, set())
    ours[module].add(target)
    assert any(expected in v for v in violations(ours, GRAPH[1]))


def test_a_pure_module_outside_the_rules_is_named() -> None:
    ours = {m: set(targets) for m, targets in GRAPH[0].items()}
    theirs = {m: set(names) for m, names in GRAPH[1].items()}
    ours["streams.new_rule"], theirs["streams.new_rule"] = {"streams.rules.throttle"}, set()
    assert "a pure module outside streams/rules: streams.new_rule" in violations(ours, theirs)
