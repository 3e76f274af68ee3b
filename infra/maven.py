"""Jars from Maven Central: `mvn dependency:copy-dependencies` of a pom of packaging `pom`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from infra.errors import PrerequisiteMissing, StackError


def copy_dependencies(pom: Path, libs: Path, what: str) -> Path:
    """Resolve the runtime jars of `pom` into `libs` once; later calls are a file check."""
    marker = libs.parent / ".complete"
    if marker.exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PrerequisiteMissing("mvn not found: install Maven (e.g. apt-get install maven)")
    libs.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            mvn,
            "-q",
            "-B",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={libs}",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        detail = (proc.stdout + proc.stderr).strip().splitlines()
        hint = next((line for line in detail if "ERROR" in line), detail[-1] if detail else "")
        raise StackError(
            f"could not fetch the {what} jars from Maven Central (is it reachable? is ~/.m2 "
            f"writable?): {hint.strip()}"
        )
    marker.write_text(what)
    return libs
