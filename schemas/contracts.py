"""`flashsend schemas check|register`: the contract files against their history.

Convention (schemas/avro/): `<name>.v<N>.avsc`, one file per version, never edited once
released; a compatible change is a new file `<name>.v<N+1>.avsc` with the same record name and
namespace (the namespace's `.v1` is the contract line, which only an incompatible change —
a new contract name and subject — would change). The subject is `flashsend.<name>-value`.

- offline (CI, no registry): each released version against its fingerprint in the committed
  `released.json` (schemas/released.py: immutable once released, whatever the checkout), each
  version against the earlier versions in the directory, and each file against its own
  content in git (default HEAD: an uncommitted edit);
- against the registry: the latest file of each contract via the registry's compatibility
  endpoint (the registry applies the subject's level; a missing subject is simply new).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from schemas.compat import compatibility_problems
from schemas.released import lock_problems, read_lock
from schemas.serde import SCHEMA_DIR, SchemaFile, schema_files


@dataclass
class CheckResult:
    file: str
    against: str
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "against": self.against,
            "ok": self.ok,
            "problems": self.problems,
        }


def _load(text: str, label: str) -> tuple[Any, list[str]]:
    try:
        schema = json.loads(text)
        fastavro.parse_schema(schema)
    except Exception as exc:  # json and fastavro raise many types on a bad file
        return None, [f"{label} is not a valid Avro schema: {exc}"]
    return schema, []


def _convention(f: SchemaFile, schema: Any, first: Any) -> list[str]:
    problems = []
    if not isinstance(schema, dict) or schema.get("type") != "record":
        problems.append("a contract must be an Avro record")
    elif isinstance(first, dict) and (
        (schema.get("name"), schema.get("namespace")) != (first.get("name"), first.get("namespace"))
    ):
        problems.append(
            f"record name/namespace changed from {first.get('namespace')}.{first.get('name')} "
            f"(a compatible version keeps them; an incompatible change is a new contract)"
        )
    return problems


def git_text(path: Path, rev: str) -> str | None:
    """The file's content at `rev`, or None (not in git, not a repository, no git)."""
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=path.parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        rel = path.resolve().relative_to(Path(top).resolve())
        out = subprocess.run(
            ["git", "show", f"{rev}:{rel.as_posix()}"],
            cwd=top,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError, ValueError):
        return None
    return out.stdout if out.returncode == 0 else None


def check_offline(
    level: str,
    directory: Path = SCHEMA_DIR,
    git_rev: str | None = "HEAD",
    lock: Path | None = None,
) -> list[CheckResult]:
    """Each version against the earlier ones at `level`; with `lock` (the committed
    released.json, required when given), each released version against its fingerprint; with
    `git_rev`, each file against its content at that revision."""
    results: list[CheckResult] = []
    if lock is not None:
        results += _against_lock(directory, lock)
    by_name: dict[str, list[tuple[SchemaFile, Any]]] = {}
    for f in schema_files(directory):
        schema, problems = _load(f.text(), f.path.name)
        history = by_name.setdefault(f.name, [])
        if problems:
            results.append(CheckResult(f.path.name, "itself", problems))
            continue
        first = history[0][1] if history else None
        problems = _convention(f, schema, first)
        if history:
            previous = [s for _f, s in history]
            problems += compatibility_problems(schema, previous, level)
            results.append(CheckResult(f.path.name, history[-1][0].path.name, problems))
        elif problems:
            results.append(CheckResult(f.path.name, "itself", problems))
        history.append((f, schema))
        if git_rev:
            results += _against_git(f, schema, level, git_rev)
    return results


def _against_lock(directory: Path, lock: Path) -> list[CheckResult]:
    if not lock.exists():
        return [
            CheckResult(
                lock.name,
                "itself",
                [f"{lock} is missing: run `flashsend schemas lock` and commit it"],
            )
        ]
    try:
        recorded = read_lock(lock)
    except ValueError as exc:
        return [CheckResult(lock.name, "itself", [f"{lock} is not a valid lock: {exc}"])]
    problems = lock_problems(schema_files(directory), recorded)
    return [CheckResult(name, lock.name, p) for name, p in sorted(problems.items())]


def _against_git(f: SchemaFile, schema: Any, level: str, rev: str) -> list[CheckResult]:
    old_text = git_text(f.path, rev)
    if old_text is None or old_text == f.text():
        return []
    old, problems = _load(old_text, f"{f.path.name}@{rev}")
    if not problems:
        problems = compatibility_problems(schema, [old], level)
        problems.insert(0, "released contract file edited in place: add a new version file")
    return [CheckResult(f.path.name, f"{f.path.name}@{rev}", problems)]


def latest_files(directory: Path = SCHEMA_DIR) -> list[SchemaFile]:
    newest: dict[str, SchemaFile] = {}
    for f in schema_files(directory):
        newest[f.name] = f
    return list(newest.values())


def check_registry(
    client: SchemaRegistryClient, level: str, directory: Path = SCHEMA_DIR
) -> list[CheckResult]:
    """The latest file of each contract against the subject's latest version: as the registry
    judges it (under the subject's level, or its global BACKWARD), and by our own rules at
    `level` (which also says why: the registry's ccompat answer carries no reasons)."""
    results = []
    for f in latest_files(directory):
        try:
            ok = client.test_compatibility(f.subject, Schema(f.text(), "AVRO"))
            latest = client.get_latest_version(f.subject)
        except SchemaRegistryError as exc:
            if exc.error_code in (40401, 40402):  # subject / version not found: a new contract
                results.append(CheckResult(f.path.name, f"{f.subject} (new subject)"))
                continue
            results.append(CheckResult(f.path.name, f.subject, [f"registry error: {exc}"]))
            continue
        problems = [] if ok else [f"the registry rejects it as incompatible with {f.subject}"]
        registered = json.loads(latest.schema.schema_str or "null") if latest.schema else None
        if registered is not None:
            problems += compatibility_problems(json.loads(f.text()), [registered], level)
        results.append(CheckResult(f.path.name, f"{f.subject} v{latest.version}", problems))
    return results


def register_all(
    client: SchemaRegistryClient, level: str, directory: Path = SCHEMA_DIR
) -> list[dict[str, Any]]:
    """Set each subject's level, then register every version in order (history kept)."""
    done = []
    configured: set[str] = set()
    for f in schema_files(directory):
        if f.subject not in configured:
            client.set_compatibility(f.subject, level)
            configured.add(f.subject)
        registered = client.register_schema_full_response(f.subject, Schema(f.text(), "AVRO"))
        done.append({"file": f.path.name, "subject": f.subject, "id": registered.schema_id})
    return done
