"""Seed list parsing and the hold's due logic (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from producers.corrections import correction_audience
from streams.seed_list import (
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
