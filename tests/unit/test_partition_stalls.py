"""The bench's stall figure: the longest silence of any partition between two of its sends."""

from __future__ import annotations

import pytest

from flashsend.lab.partition_stalls import longest_silence


def test_steady_partitions_have_short_silences() -> None:
    sends = [(p, t / 10) for p in range(3) for t in range(100)]
    stall = longest_silence(sends)
    assert stall.seconds == pytest.approx(0.1)
    assert stall.ends_spread_s == pytest.approx(0.0)


def test_the_silent_partition_is_named() -> None:
    # Partition 1 stops at 2 s and resumes at 26 s, as in the 1M bench of 2026-12-03 10:20.
    sends = [(0, t) for t in range(30)] + [(1, t) for t in (0, 1, 2, 26, 27)] + [(2, 5.0)]
    stall = longest_silence(reversed(sends))  # any order
    assert stall.seconds == 24
    assert stall.partition == 1
    assert stall.ends_spread_s == 29 - 5


def test_no_sends_means_no_stall() -> None:
    stall = longest_silence([])
    assert (stall.seconds, stall.partition, stall.ends_spread_s) == (0.0, None, 0.0)
    assert stall.as_dict() == {"max_s": 0.0, "partition": None, "ends_spread_s": 0.0}
