"""The chaos run's scheduling decisions, apart from any process: which worker a rolling restart
stops next and when, which worker a kill may pick, which Kafka node a broker kill takes, and
the kill schedule's default."""

from __future__ import annotations

import random

import pytest

from flashsend.lab.chaos import KILL_EVERY_S, RollingRestarts, default_kill_every, pick_victim
from infra.kafka import busiest_leader


def test_each_worker_is_restarted_in_turn_before_any_replacement() -> None:
    rolling: RollingRestarts[str] = RollingRestarts(every_s=5)
    alive = ["a", "b", "c"]
    stopped: list[str] = []
    t = 0.0
    for _ in range(6):
        while not rolling.due(t):
            t += 0.5
        worker = rolling.next_worker(alive)
        assert worker is not None
        rolling.began(worker, t)
        stopped.append(worker)
        t += 1.5  # its drain
        assert rolling.ended(t) == 1.5
        alive.remove(worker)
        alive.append(worker + "'")  # the replacement joins the end of the live list
    assert stopped == ["a", "b", "c", "a'", "b'", "c'"]


def test_a_restart_is_due_every_period_and_never_during_a_drain() -> None:
    rolling: RollingRestarts[str] = RollingRestarts(every_s=5)
    assert not rolling.due(4.9)
    assert rolling.due(5.0)
    rolling.began("a", 5.0)
    assert not rolling.due(10.0) and not rolling.due(30.0)  # "a" has not exited yet
    rolling.ended(12.0)
    assert rolling.due(12.0)  # overdue since 10.0: right after the drain
    assert rolling.began("b", 12.0) == 2.0  # 2 s late
    rolling.ended(13.0)
    assert not rolling.due(16.9) and rolling.due(17.0)  # 5 s after the previous SIGTERM


def test_no_rolling_restart_without_a_period() -> None:
    assert not RollingRestarts[str](every_s=0).due(1e9)


def test_the_frozen_worker_is_skipped_and_nothing_is_picked_from_no_worker() -> None:
    rolling: RollingRestarts[str] = RollingRestarts(every_s=5)
    assert rolling.next_worker(["a", "b"], frozen="a") == "b"
    assert rolling.next_worker(["a"], frozen="a") is None
    assert rolling.next_worker([]) is None


def test_a_kill_spares_the_draining_and_the_frozen_worker_while_another_is_alive() -> None:
    rng = random.Random(1)
    picks = {pick_victim(rng, ["a", "b", "c"], "a", "b") for _ in range(50)}
    assert picks == {"c"}
    assert pick_victim(rng, ["b"], None, "b") == "b"  # the only one left


def test_kill_every_defaults_to_none_with_a_rolling_restart() -> None:
    assert default_kill_every(None, 0.0) == KILL_EVERY_S
    assert default_kill_every(None, 5.0) == 0.0
    assert default_kill_every(10.0, 5.0) == 10.0  # given explicitly: both faults
    assert default_kill_every(0.0, 0.0) == 0.0


def test_the_busiest_leader_leads_the_most_partitions() -> None:
    assert busiest_leader({0: 1, 1: 2, 2: 2, 3: 3}) == 2
    assert busiest_leader({0: 3, 1: 2, 2: 3, 3: 2}) == 2  # a tie: the lowest node id
    assert busiest_leader({0: -1, 1: -1, 2: 3}) == 3  # partitions with no leader do not count
    with pytest.raises(ValueError):
        busiest_leader({0: -1})
