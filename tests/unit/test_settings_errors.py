"""Every FLASHSEND_* setting that does not parse stops a command with one line naming it and
a valid value; list settings take the comma form people type as well as JSON."""

from __future__ import annotations

import subprocess
import sys
from typing import Literal, get_origin

import pytest

from flashsend.settings import ENV_PREFIX, Settings, SettingsInvalid, load_settings


def _malformed(name: str) -> str | None:
    """A value the setting cannot take, or None when any text is one (paths, free text)."""
    annotation = Settings.model_fields[name].annotation
    text = str(annotation)
    if annotation == tuple[str, ...]:
        return "[1,"  # a JSON array cut short
    if get_origin(annotation) is Literal:
        return "no-such-choice"
    if "bool" in text:
        return "maybe"
    if "int" in text or "float" in text:
        return "twelve"
    return None


CHECKED = [name for name in Settings.model_fields if _malformed(name) is not None]


def test_most_settings_can_be_malformed() -> None:
    assert len(CHECKED) >= 60, CHECKED  # the test covers the typed settings, not a few


@pytest.mark.parametrize("name", CHECKED)
def test_a_malformed_setting_is_one_line_with_a_valid_example(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = f"{ENV_PREFIX}{name.upper()}"
    monkeypatch.setenv(env, _malformed(name) or "")
    with pytest.raises(SettingsInvalid) as raised:
        load_settings()
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{env}: "), message
    example = message.rsplit(", e.g. ", 1)[1]
    monkeypatch.setenv(env, example)
    load_settings()  # the example given is a value the setting takes


def test_list_settings_take_commas_and_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHSEND_SES_EVENT_TYPES", "Delivery, Open ,Click")
    assert load_settings().ses_event_types == ("Delivery", "Open", "Click")
    monkeypatch.setenv("FLASHSEND_SES_EVENT_TYPES", '["Delivery", "Rendering Failure"]')
    assert load_settings().ses_event_types == ("Delivery", "Rendering Failure")
    monkeypatch.setenv("FLASHSEND_SES_EVENT_TYPES", "")
    assert load_settings().ses_event_types == ()


def test_the_command_line_prints_the_one_line() -> None:
    env = {"FLASHSEND_PG_PORT": "abc", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "flashsend.cli", "status-stack"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "flashsend: error: FLASHSEND_PG_PORT: Input should be a valid integer, unable to parse "
        "string as an integer (got 'abc'), e.g. 15432"
    ]
