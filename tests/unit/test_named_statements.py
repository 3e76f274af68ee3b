"""Every named statement in sinks/sql/*.sql is usable as psycopg query text."""

from __future__ import annotations

import re

import pytest

from sinks.queries import _load

PLACEHOLDER = re.compile(r"%\(\w+\)s|%%")
STATEMENTS = sorted(_load().items())


@pytest.mark.parametrize(("name", "text"), STATEMENTS, ids=[name for name, _ in STATEMENTS])
def test_a_percent_sign_is_a_placeholder_or_doubled(name: str, text: str) -> None:
    """psycopg reads every `%` of the text, comments included: a `30 %` in a comment made
    the claim fail with "incomplete placeholder" at run time."""
    assert "%" not in PLACEHOLDER.sub("", text), name
