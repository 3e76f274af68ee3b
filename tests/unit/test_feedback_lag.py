"""The feedback agent's lag reports and the send side's gate (streams.rules.feedback_lag), on
simulated time."""

from __future__ import annotations

import pytest

from streams.rules.feedback_lag import FeedbackGate, ProgressTracker


def test_a_partition_caught_up_reports_nothing_waiting() -> None:
    tracker = ProgressTracker()
    tracker.applied(0, last_offset=99, timestamp=1000.0)
    assert tracker.report({0: 100}, now=1005.0) == {0: None}


def test_a_partition_behind_has_waited_since_its_last_applied_event() -> None:
    tracker = ProgressTracker()
    tracker.applied(0, last_offset=99, timestamp=1000.0)
    # Seen behind for the first time long after that event: the waiting event is new.
    assert tracker.report({0: 150}, now=1060.0) == {0: 1060.0}
    # Still behind, nothing applied: the wait keeps its start, so the lag grows.
    assert tracker.report({0: 180}, now=1063.0) == {0: 1060.0}
    # The agent works through the backlog: the wait starts at what it applied last.
    tracker.applied(0, last_offset=149, timestamp=1062.5)
    assert tracker.report({0: 180}, now=1064.0) == {0: 1062.5}
    tracker.applied(0, last_offset=179, timestamp=1063.9)
    assert tracker.report({0: 180}, now=1064.5) == {0: None}
    # Behind again later: a new wait, not the old one.
    assert tracker.report({0: 181}, now=1100.0) == {0: 1100.0}


def test_a_stuck_agent_reports_a_growing_lag_and_a_busy_one_a_steady_lag() -> None:
    stuck, busy = ProgressTracker(), ProgressTracker()
    for t in (stuck, busy):
        t.applied(0, last_offset=9, timestamp=100.0)
        t.report({0: 20}, now=100.2)  # behind from here
    lags_stuck, lags_busy = [], []
    for second in range(1, 6):
        now = 100.0 + second
        busy.applied(0, last_offset=9 + second * 10, timestamp=now - 2.0)
        end = {0: 20 + second * 10}
        lags_stuck.append(now - (stuck.report(end, now)[0] or now))
        lags_busy.append(now - (busy.report(end, now)[0] or now))
    assert lags_stuck == pytest.approx([0.8, 1.8, 2.8, 3.8, 4.8])
    assert lags_busy[-1] == pytest.approx(2.0)


def test_unknown_ends_and_forgotten_partitions_are_left_out() -> None:
    tracker = ProgressTracker()
    tracker.applied(0, last_offset=5, timestamp=10.0)
    tracker.applied(1, last_offset=5, timestamp=10.0)
    tracker.forget(1)
    assert tracker.report({0: None, 1: 50}, now=20.0) == {}


def test_an_assignment_starts_each_partition_where_the_agent_resumes_it() -> None:
    tracker = ProgressTracker()
    tracker.applied(0, last_offset=99, timestamp=10.0)
    tracker.applied(1, last_offset=49, timestamp=10.0)
    tracker.assigned({1: 50, 2: 7})  # 0 went to another worker; 1 kept; 2 new here
    assert tracker.partitions() == [1, 2]
    # A new partition with nothing to apply is caught up before its first batch...
    assert tracker.report({1: 50, 2: 7}, now=20.0) == {1: None, 2: None}
    # ... and one with a backlog is behind from the first report that sees it.
    assert tracker.report({1: 50, 2: 900}, now=21.0) == {1: None, 2: 21.0}
    # Back here after another worker applied it up to 5,000: idle there means caught up,
    # not behind since offset 100 (which would hold campaigns until an event arrives).
    tracker.assigned({0: 5_000})
    assert tracker.report({0: 5_000}, now=3_600.0) == {0: None}
    # Kept through a rebalance, but moved on by another worker in between: the same.
    tracker.applied(0, last_offset=5_009, timestamp=3_600.0)
    tracker.assigned({0: 6_000})
    assert tracker.report({0: 6_000}, now=3_700.0) == {0: None}


def test_offsets_and_timestamps_only_move_forward() -> None:
    tracker = ProgressTracker()
    tracker.applied(0, last_offset=50, timestamp=30.0)
    tracker.applied(0, last_offset=20, timestamp=10.0)  # a replayed batch below the stored offset
    assert tracker.report({0: 51}, now=40.0) == {0: None}
    assert tracker.report({0: 60}, now=41.0) == {0: 41.0}
    tracker.applied(0, last_offset=52, timestamp=None)
    assert tracker.report({0: 60}, now=42.0) == {0: 41.0}


def test_the_gate_closes_over_the_limit_and_opens_within_half_of_it() -> None:
    gate = FeedbackGate(max_lag_s=3.0)
    steps = [(None, False), (2.9, False), (3.1, True), (2.0, True), (1.6, True), (1.5, False)]
    for lag, closed in steps:
        assert gate.update(lag) is closed, (lag, closed)
    assert gate.update(4.0) is True
    assert gate.update(None) is False  # no fresh report: nothing to hold for
    assert gate.update(4.0) is True
    assert gate.update(0.0) is False  # caught up


def test_a_gate_without_a_limit_never_closes() -> None:
    gate = FeedbackGate(max_lag_s=0)
    assert gate.update(10_000.0) is False
