"""Released contract versions are immutable, checked against the committed released.json.

The clone tests run the clone's own `flashsend schemas check --offline`, as CI does on a fresh
checkout, where HEAD is the working tree and a comparison with git sees nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.contracts import check_offline
from schemas.released import LOCK_FILE, fingerprint, lock_directory, lock_problems, read_lock
from schemas.serde import SCHEMA_DIR, schema_files

ROOT = Path(__file__).resolve().parents[2]


def _failures(directory: Path) -> dict[str, list[str]]:
    results = check_offline("FULL", directory, git_rev=None, lock=directory / LOCK_FILE)
    return {r.file: r.problems for r in results if not r.ok}


def _add_field(path: Path, field: dict[str, object]) -> None:
    schema = json.loads(path.read_text())
    schema["fields"].append(field)
    path.write_text(json.dumps(schema, indent=2))


def test_shipped_contracts_are_all_released_and_pass_the_offline_check() -> None:
    lock = read_lock(SCHEMA_DIR / LOCK_FILE)
    assert {(f.subject, str(f.version)) for f in schema_files()} == {
        (s, v) for s, versions in lock.items() for v in versions
    }
    assert _failures(SCHEMA_DIR) == {}


@pytest.mark.parametrize(
    "field",
    [
        {"name": "region", "type": "string"},  # required: old records cannot be read
        {"name": "region", "type": ["null", "string"], "default": None},  # compatible, still
    ],
)
def test_an_in_place_edit_of_a_released_file_fails_without_git(
    tmp_path: Path, field: dict[str, object]
) -> None:
    directory = tmp_path / "avro"
    shutil.copytree(SCHEMA_DIR, directory)
    _add_field(directory / "unsubscribed.v1.avsc", field)
    failures = _failures(directory)
    assert list(failures) == ["unsubscribed.v1.avsc"]
    assert (
        "released version 1 of flashsend.unsubscribed-value was edited in place"
        in (failures["unsubscribed.v1.avsc"][0])
    )
    assert "unsubscribed.v2.avsc" in failures["unsubscribed.v1.avsc"][0]


def test_reformatting_is_not_an_edit_and_lock_never_rewrites_a_version(tmp_path: Path) -> None:
    directory = tmp_path / "avro"
    shutil.copytree(SCHEMA_DIR, directory)
    path = directory / "order_event.v1.avsc"
    path.write_text(json.dumps(json.loads(path.read_text())))  # same schema, other layout
    assert _failures(directory) == {}
    _add_field(path, {"name": "x", "type": "int"})
    before = (directory / LOCK_FILE).read_text()
    assert lock_directory(directory) == []  # the edited version stays recorded as released
    assert (directory / LOCK_FILE).read_text() == before
    assert "order_event.v1.avsc" in _failures(directory)


def test_a_new_version_must_be_released_and_a_released_one_cannot_vanish(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "avro"
    shutil.copytree(SCHEMA_DIR, directory)
    v2 = json.loads((directory / "unsubscribed.v1.avsc").read_text())
    v2["fields"].append({"name": "region", "type": ["null", "string"], "default": None})
    (directory / "unsubscribed.v2.avsc").write_text(json.dumps(v2))
    assert "not in released.json" in _failures(directory)["unsubscribed.v2.avsc"][0]
    assert lock_directory(directory) == ["unsubscribed.v2.avsc"]
    assert _failures(directory) == {}
    (directory / "unsubscribed.v1.avsc").unlink()
    assert "was deleted" in _failures(directory)["unsubscribed.v1.avsc"][0]
    (directory / LOCK_FILE).unlink()
    assert "missing" in _failures(directory)[LOCK_FILE][0]


def test_lock_problems_are_pure_over_text_and_lock(tmp_path: Path) -> None:
    (tmp_path / "probe.v1.avsc").write_text('{"type": "record", "name": "P", "fields": []}')
    files = schema_files(tmp_path)
    ok = {"flashsend.probe-value": {"1": fingerprint(files[0].text())}}
    assert lock_problems(files, ok) == {}
    assert list(lock_problems(files, {"flashsend.probe-value": {"1": "sha256:0"}})) == [
        "probe.v1.avsc"
    ]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


@pytest.mark.parametrize(
    "field",
    [
        {"name": "region", "type": "string"},
        {"name": "region", "type": ["null", "string"], "default": None},
    ],
)
def test_an_edit_committed_in_a_clone_fails_flashsend_schemas_check(
    tmp_path: Path, field: dict[str, object]
) -> None:
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", "--no-hardlinks", str(ROOT), str(clone))
    if not (clone / "schemas" / "avro" / LOCK_FILE).exists():
        pytest.fail("released.json is not committed: the clone has no lock")
    _add_field(clone / "schemas" / "avro" / "unsubscribed.v1.avsc", field)
    _git(clone, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "edit in place")
    run = subprocess.run(
        [sys.executable, "-m", "flashsend.cli", "schemas", "check", "--offline"],
        cwd=clone,
        env={"PYTHONPATH": str(clone), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAIL unsubscribed.v1.avsc" in run.stdout
    assert "released version 1 of flashsend.unsubscribed-value was edited in place" in run.stdout
    assert str(clone) in run.stdout or "released.json" in run.stdout
