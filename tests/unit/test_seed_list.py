"""Seed list parsing and the hold's due logic (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from flashsend.cli.campaign import read_seed_plan
from producers.corrections import correction_audience
from streams.rules.seed_list import (
    DEFAULT_HOLD_S,
    MAX_SEEDS,
    HoldState,
    SeedListError,
    hold_due,
    parse_seed_list,
    seed_user_id,
)

T0 = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)


def test_addresses_are_normalised_in_order_once_comments_and_blanks_skipped() -> None:
    lines = [
        "# team inboxes\n",
        "\n",
        "  QA@Example.com \n",
        "boss@example.com\n",
        "qa@example.com",
    ]
    assert parse_seed_list(lines) == ["qa@example.com", "boss@example.com"]


def test_an_invalid_address_is_refused_naming_its_line_and_reason() -> None:
    with pytest.raises(SeedListError, match=r"seeds.txt, line 3: 'not-an-address' .*no_at"):
        parse_seed_list(["a@example.com", "# x", "not-an-address"], "seeds.txt")
    with pytest.raises(SeedListError, match=r"line 1: .*bad_domain"):
        parse_seed_list(["a@localhost"])


def test_an_empty_or_huge_list_is_refused() -> None:
    with pytest.raises(SeedListError, match="no address"):
        parse_seed_list(["# only a comment", ""])
    with pytest.raises(SeedListError, match="more than"):
        parse_seed_list([f"s{i}@example.com" for i in range(MAX_SEEDS + 1)])


def test_seed_user_ids_are_negative_and_distinct() -> None:
    assert [seed_user_id(i) for i in range(3)] == [-1, -2, -3]


def _hold(
    status: str = "sending", until: datetime | None = T0, released: bool = False
) -> HoldState:
    return HoldState(1, status, 2, until, T0 if released else None, "x" if released else None)


def test_the_hold_is_due_at_its_end_only_for_a_sending_unreleased_campaign() -> None:
    assert not hold_due(_hold(), T0 - timedelta(seconds=1))
    assert hold_due(_hold(), T0)
    assert not hold_due(_hold(status="paused"), T0 + timedelta(hours=1))
    assert not hold_due(_hold(status="cancelled"), T0 + timedelta(hours=1))
    assert not hold_due(_hold(released=True), T0 + timedelta(hours=1))
    assert not hold_due(_hold(until=None), T0 + timedelta(hours=1))
    assert _hold().holding and not _hold(released=True).holding


def test_a_correction_audience_is_the_sent_rows_within_the_base_condition() -> None:
    text = correction_audience(41, "u.status = 'active'")
    assert "r.campaign_id = 41 AND r.status = 'sent'" in text
    assert text.endswith("AND (u.status = 'active')")


def test_the_start_command_reads_the_file_before_anything_is_written(tmp_path: Path) -> None:
    good = tmp_path / "seeds.txt"
    good.write_text("# inboxes\nqa@example.com\n\nBoss@Example.com\n")
    plan = read_seed_plan(str(good), "90s")
    assert plan is not None and plan.emails == ["qa@example.com", "boss@example.com"]
    assert plan.hold_s == 90.0
    default = read_seed_plan(str(good), None)
    assert default is not None and default.hold_s == DEFAULT_HOLD_S
    assert read_seed_plan(None, None) is None
    with pytest.raises(SeedListError, match="--hold needs --seed-list"):
        read_seed_plan(None, "5m")
    with pytest.raises(SeedListError, match="No such file"):
        read_seed_plan(str(tmp_path / "missing.txt"), None)
    bad = tmp_path / "bad.txt"
    bad.write_text("qa@example.com\nqa@@example.com\n")
    with pytest.raises(SeedListError, match=r"bad.txt, line 2: 'qa@@example.com'"):
        read_seed_plan(str(bad), None)
