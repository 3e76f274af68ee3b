"""A new subject's level set by a racing worker: kept when it is ours, an error otherwise.

The registry's side of the race (409 to the later of two concurrent rules) is exercised
against Apicurio in tests/integration/test_schema_registry.py; what the loser then reads back
cannot be arranged there, so a registry answering as after a race stands in for it here.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError

from flashsend.errors import FlashsendError
from schemas.serde import _set_level_once


class RacedRegistry:
    """Answers a level rule with 409: another worker set `level` first."""

    def __init__(self, level: str, status: int = 409) -> None:
        self.level = level
        self.status = status

    def set_compatibility(self, subject: str, level: str) -> Any:
        raise SchemaRegistryError(self.status, 0, f"rule for {subject} already exists")

    def get_compatibility(self, subject: str) -> str:
        return self.level


def test_the_level_the_other_worker_set_is_kept_when_it_is_ours() -> None:
    _set_level_once(RacedRegistry("FULL"), "s-value", "FULL")  # type: ignore[arg-type]


def test_another_level_is_an_error_that_names_both() -> None:
    with pytest.raises(FlashsendError, match="s-value is at NONE, not the configured FULL"):
        _set_level_once(RacedRegistry("NONE"), "s-value", "FULL")  # type: ignore[arg-type]


def test_other_registry_errors_are_not_swallowed() -> None:
    with pytest.raises(SchemaRegistryError):
        _set_level_once(RacedRegistry("FULL", status=500), "s-value", "FULL")  # type: ignore[arg-type]
