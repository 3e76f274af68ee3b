"""Who may register schemas at start: only processes on the local stack."""

from __future__ import annotations

import pytest

from flashsend.settings import load_settings


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mock://flashsend", True),
        ("", True),  # the local Apicurio on 127.0.0.1
        ("http://127.0.0.1:18081/apis/ccompat/v7", True),
        ("http://localhost:8081", True),
        ("https://registry.internal.example:8081", False),
        ("http://10.0.0.7:8081/apis/ccompat/v7", False),
    ],
)
def test_auto_register_only_on_the_local_stack(url: str, expected: bool) -> None:
    assert load_settings(schema_registry_url=url).schema_auto_register is expected


def test_auto_register_can_be_turned_off_locally() -> None:
    settings = load_settings(schema_registry_url="mock://x", schema_auto_register=False)
    assert settings.schema_auto_register is False
