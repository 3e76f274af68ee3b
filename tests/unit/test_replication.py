"""Replication settings against a cluster's broker count (pure)."""

from __future__ import annotations

import pytest

from flashsend.settings import load_settings
from producers.topics import Replication


def test_local_defaults_fit_one_broker() -> None:
    replication = Replication.of(load_settings())
    assert replication == Replication(1, 1)
    assert replication.problem(1) is None
    assert replication.topic_config() == {"min.insync.replicas": "1"}


@pytest.mark.parametrize(
    ("factor", "min_insync", "brokers", "expected"),
    [
        (3, 2, 3, None),
        (3, 2, 5, None),
        (3, 2, 1, "the cluster has 1 broker(s)"),
        (2, 3, 3, "exceeds"),
        (0, 1, 3, "must be >= 1"),
        (1, 0, 3, "must be >= 1"),
        # The topics exist: a broker down does not count against them; the pair still does.
        (3, 2, None, None),
        (2, 3, None, "exceeds"),
    ],
)
def test_problem(factor: int, min_insync: int, brokers: int | None, expected: str | None) -> None:
    problem = Replication(factor, min_insync).problem(brokers)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem and "\n" not in problem
