"""The campaign sender's configuration: lanes big enough to keep a full call queued, and a
window slack that stays a small fraction of the limit."""

from __future__ import annotations

import pytest

from flashsend.settings import Settings
from streams.sender import MAX_ENTRIES, SenderConfig


def test_a_lane_holds_two_full_calls_by_default() -> None:
    # One queued call plus the half lane its feeder claims: a lane short of a call has room
    # for the next claim, so it never sends a short call while its window has room.
    lane = SenderConfig(partitions=12).lane_capacity
    assert lane >= 2 * MAX_ENTRIES
    assert (MAX_ENTRIES - 1) + lane // 2 <= lane


def test_a_lane_of_one_call_is_refused() -> None:
    with pytest.raises(ValueError, match="two full calls"):
        SenderConfig(partitions=12, lane_capacity=MAX_ENTRIES)


def test_the_window_slack_is_a_small_fraction() -> None:
    assert Settings().window_slack == 0.02
    assert Settings(window_slack=0).window_slack == 0  # the strict bound
    for wrong in (-0.01, 0.5):
        with pytest.raises(ValueError, match=r"FLASHSEND_WINDOW_SLACK must be 0\.\.0\.1"):
            Settings(window_slack=wrong)
