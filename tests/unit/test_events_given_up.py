"""What the bench counts as events the stand-in gave up on, over every delivery path."""

from __future__ import annotations

from typing import Any

from flashsend.lab.events_lag import given_up


def state(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"subscriptions": [], "overflow": 0, "dropped": 0}
    return base | changes


def test_nothing_lost_counts_zero() -> None:
    assert given_up(state()) == 0
    assert given_up(state(firehose={"s": {"dropped_records": 0, "overflow": 0}})) == 0


def test_every_path_s_losses_add_up() -> None:
    sns = [{"delivery": {"dropped": 3}}, {"delivery": {}}]
    streams = {"a": {"dropped_records": 500, "overflow": 7}, "b": {"dropped_records": 1}}
    assert given_up(state(subscriptions=sns, overflow=2, dropped=5, firehose=streams)) == 518
