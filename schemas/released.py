"""Released contract versions are immutable: a committed lock of their fingerprints.

`schemas/avro/released.json` maps each subject to `{version: fingerprint}`. A fingerprint is
the SHA-256 of the schema's canonical JSON (keys sorted, no whitespace), so reformatting a file
changes nothing while any change a reader could see (a field, a default, a doc) changes it.

Why a lock and not only `git diff HEAD`: in CI the checkout *is* HEAD, so an in-place edit that
was committed compares equal to itself. The lock is committed beside the files; an edit of a
released file no longer matches it, whatever the checkout. `flashsend schemas lock` records new
versions and never rewrites a recorded one, so releasing a version is a visible diff of
released.json and changing a released one needs a hand edit a reviewer sees.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from schemas.serde import SchemaFile, schema_files

LOCK_FILE = "released.json"

Lock = dict[str, dict[str, str]]  # subject -> version (as text, JSON keys) -> fingerprint


def fingerprint(schema_text: str) -> str:
    canonical = json.dumps(json.loads(schema_text), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def read_lock(path: Path) -> Lock:
    data: Any = json.loads(path.read_text())
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"{path} must map each subject to {{version: fingerprint}}")
    return {str(s): {str(v): str(fp) for v, fp in versions.items()} for s, versions in data.items()}


def write_lock(path: Path, lock: Mapping[str, Mapping[str, str]]) -> None:
    ordered = {
        s: dict(sorted(lock[s].items(), key=lambda item: int(item[0]))) for s in sorted(lock)
    }
    path.write_text(json.dumps(ordered, indent=2) + "\n")


def lock_problems(files: list[SchemaFile], lock: Lock) -> dict[str, list[str]]:
    """Problems per file name: a released version edited or deleted, or a version not released.

    Pure over the files' current text and the lock."""
    found: dict[str, list[str]] = {}
    present: set[tuple[str, str]] = set()
    for f in files:
        version = str(f.version)
        present.add((f.subject, version))
        recorded = lock.get(f.subject, {}).get(version)
        try:
            current = fingerprint(f.text())
        except ValueError:
            continue  # not JSON: reported by the schema check itself
        if recorded is None:
            found.setdefault(f.path.name, []).append(
                f"version {version} of {f.subject} is not in {LOCK_FILE}: run "
                f"`flashsend schemas lock` and commit {LOCK_FILE} with the new file"
            )
        elif recorded != current:
            found.setdefault(f.path.name, []).append(
                f"released version {version} of {f.subject} was edited in place (its "
                f"fingerprint no longer matches {LOCK_FILE}): restore it "
                f"(`git log -p -- {f.path.name}`) and put the change in {f.name}.v"
                f"{max(g.version for g in files if g.name == f.name) + 1}.avsc"
            )
    for subject, versions in sorted(lock.items()):
        for version in sorted(versions, key=int):
            if (subject, version) not in present:
                contract = subject.removeprefix("flashsend.").removesuffix("-value")
                name = f"{contract}.v{version}.avsc"
                found.setdefault(name, []).append(
                    f"released version {version} of {subject} was deleted: consumers may still "
                    "read records written with it"
                )
    return found


def locked(files: list[SchemaFile], lock: Lock) -> tuple[Lock, list[str]]:
    """The lock with every unrecorded version added; recorded ones are never changed.
    Returns (new lock, names of the files added)."""
    out: Lock = {s: dict(v) for s, v in lock.items()}
    added = []
    for f in files:
        versions = out.setdefault(f.subject, {})
        if str(f.version) not in versions:
            versions[str(f.version)] = fingerprint(f.text())
            added.append(f.path.name)
    return out, added


def lock_directory(directory: Path) -> list[str]:
    """`flashsend schemas lock`: record the unreleased versions of `directory`."""
    path = directory / LOCK_FILE
    lock = read_lock(path) if path.exists() else {}
    new, added = locked(schema_files(directory), lock)
    if added or not path.exists():
        write_lock(path, new)
    return added
