"""`flashsend up` waits for the SES stand-in as long as its journal's replay may take."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashsend.settings import load_settings
from infra.stack import (
    REPLAY_NOTICE_BYTES,
    SesStandin,
    replay_notice,
    standin_start_timeout,
)


def test_an_empty_journal_waits_the_base_time() -> None:
    assert standin_start_timeout(0) == 30.0


def test_the_wait_grows_with_the_journal() -> None:
    # 1.6 GB replayed in 27.3 s on a fast day; the old fixed 30 s failed at ~7 GB.
    assert standin_start_timeout(1_600_000_000) >= 27.3 * 2
    assert standin_start_timeout(7_000_000_000) > standin_start_timeout(1_600_000_000) > 30.0


def test_a_small_journal_starts_quietly() -> None:
    assert replay_notice(REPLAY_NOTICE_BYTES - 1, "http://127.0.0.1:14566") is None


def test_a_big_journal_says_how_long_and_how_to_empty_it() -> None:
    notice = replay_notice(1_600_000_000, "http://127.0.0.1:14566")
    assert notice is not None
    assert "1.6 GB" in notice
    assert "curl -X POST http://127.0.0.1:14566/_admin/reset" in notice
    assert f"{standin_start_timeout(1_600_000_000):.0f}s" in notice


def test_the_journal_size_is_read_from_the_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLASHSEND_STATE_DIR", str(tmp_path))
    standin = SesStandin(load_settings())
    assert standin.journal_bytes() == 0
    (tmp_path / "ses").mkdir()
    (tmp_path / "ses" / "messages.jsonl").write_text('{"a":1}\n')
    assert standin.journal_bytes() == 8
