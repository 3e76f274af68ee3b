"""A partition whose lane is full holds back only itself (streams/sender.py claim feeders).

The sender runs in-process against the real PostgreSQL and SES stand-in; the test hands it
consumed records directly (what Faust would deliver), so it can hold one partition's lane full
at a slow rate share and check that the agent is not blocked behind it.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg

from flashsend.settings import Settings
from producers.campaign import snapshot
from sinks.campaign_store import CampaignStore
from sinks.offsets import Assignment
from sinks.users import seed_users
from streams.app import Runtime
from streams.sender import (
    MAX_CLAIM_RECIPIENTS,
    MAX_ENTRIES,
    PAUSE_ABOVE,
    UNCLAIMED_PER_PARTITION,
    SenderConfig,
)
from tests.integration.campaign_helpers import Consumed, new_campaign, put_template, statuses
from tests.integration.campaign_helpers import consumed_records as _consumed

T = TypeVar("T")
SCENARIO_LIMIT_S = 120.0  # each wait inside is bounded far below this: over it, something hangs


def run_bounded(scenario: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, failing with every task's stack when the scenario hangs (a worker stop
    that never returns shows where it waits)."""

    async def bounded() -> T:
        task = asyncio.ensure_future(scenario)
        done, _ = await asyncio.wait({task}, timeout=SCENARIO_LIMIT_S)
        if task in done:
            return task.result()
        stacks = io.StringIO()
        for other in asyncio.all_tasks():
            other.print_stack(file=stacks)
        task.cancel()
        raise AssertionError(f"the scenario hung; its tasks:\n{stacks.getvalue()}")

    return asyncio.run(bounded())


def _rows(settings: Settings, campaign_id: int) -> list[tuple[int, int]]:
    with psycopg.connect(settings.pg_dsn) as conn:
        snapshot(conn, campaign_id, settings.audience_condition)
        return [
            (seq, user_id)
            for seq, user_id in conn.execute(
                "SELECT seq, user_id FROM campaign_recipients WHERE campaign_id = %s "
                "AND status = 'pending' ORDER BY seq",
                (campaign_id,),
            )
        ]


def _sending_or_sent(settings: Settings, campaign_id: int, seqs: list[int]) -> int:
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM campaign_recipients WHERE campaign_id = %s "
            "AND seq = ANY(%s) AND status IN ('sending', 'sent')",
            (campaign_id, seqs),
        ).fetchone()
    return int(row[0]) if row else 0


async def _until_claimed(
    settings: Settings, campaign_id: int, seqs: list[int], within: float
) -> int:
    """Wait up to `within` seconds for every seq to be sending or sent; how many are."""
    deadline = time.monotonic() + within
    while (claimed := _sending_or_sent(settings, campaign_id, seqs)) < len(seqs):
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.1)
    return claimed


def test_a_full_lane_does_not_hold_back_other_partitions(settings: Settings) -> None:
    seed_users(settings.pg_dsn, 600)
    put_template(settings)
    cid = new_campaign(settings, rate=settings.partitions)  # 1 recipient/s per partition
    rows = _rows(settings, cid)
    lane = SenderConfig(partitions=settings.partitions).lane_capacity
    slow, fast = rows[:300], rows[300:320]  # three lanes' worth, < the unclaimed bound
    assert len(fast) == 20 and lane + MAX_ENTRIES < len(slow) <= UNCLAIMED_PER_PARTITION

    def consumed(partition: int, batch: list[tuple[int, int]]) -> list[Consumed]:
        return _consumed(settings, cid, partition, batch)

    async def scenario() -> tuple[float, int, int]:
        runtime = Runtime(settings)
        try:
            await runtime.offsets(Assignment.of(settings.topic_recipients, [0, 1]))
            sender = await runtime.ensure_started()
            await sender.reassign({0, 1})
            began = time.monotonic()
            # Partition 0: three lanes' worth at 1/s. Before the feeders, the agent waited
            # here until all but the last chunk were claimed: over 100 s.
            await asyncio.wait_for(sender.handle(consumed(0, slow)), timeout=10)
            await asyncio.wait_for(sender.handle(consumed(1, fast)), timeout=10)
            fast_claimed = await _until_claimed(settings, cid, [seq for seq, _ in fast], 10)
            waited = time.monotonic() - began
            return (
                waited,
                fast_claimed,
                _sending_or_sent(settings, cid, [seq for seq, _ in slow]),
            )
        finally:
            await runtime.stop()

    waited, fast_claimed, slow_claimed = run_bounded(scenario())
    assert fast_claimed == len(fast), (waited, fast_claimed)
    # The slow partition is held to its lane: at most a full lane + 1 call's worth claimed.
    assert slow_claimed <= lane + MAX_ENTRIES, slow_claimed
    # Stopping released the rows queued in lanes; only a call in flight per lane (at this rate
    # share, a few entries) stays 'sending' for reconcile to settle.
    left = statuses(settings, cid)
    assert left.get("sending", 0) <= 2 * 5, left


def test_a_partition_moving_away_while_its_feeder_waits_for_room_fails_nothing(
    settings: Settings,
) -> None:
    """A rebalance forgets a partition's unclaimed records while its feeder waits for lane
    room; the feeder must then find nothing to claim, not fail (it once raised KeyError on the
    forgotten queue's bookkeeping, which stopped the worker and made its group rebalance)."""
    seed_users(settings.pg_dsn, 400)
    put_template(settings)
    cid = new_campaign(settings, rate=settings.partitions)  # 1 recipient/s per partition
    rows = _rows(settings, cid)

    async def scenario() -> tuple[int, BaseException | None]:
        runtime = Runtime(settings)
        try:
            await runtime.offsets(Assignment.of(settings.topic_recipients, [0, 1]))
            sender = await runtime.ensure_started()
            await sender.reassign({0, 1})
            await asyncio.wait_for(sender.handle(_consumed(settings, cid, 0, rows[:250])), 10)
            await asyncio.sleep(1)  # partition 0's lane is full; its feeder waits for room
            await sender.reassign({1})  # partition 0 moved to another worker
            await asyncio.sleep(1)
            await asyncio.wait_for(sender.handle(_consumed(settings, cid, 1, rows[250:270])), 10)
            await asyncio.sleep(0.5)
            return sender.stats["claimed"], sender._failed
        finally:
            await runtime.stop()

    claimed, failed = run_bounded(scenario())
    assert failed is None, failed
    assert claimed >= 50, claimed


def test_leftover_doorbells_of_a_cancelled_campaign_are_skipped_in_bulk(
    settings: Settings,
) -> None:
    """After a cancel, the topic still holds the campaign's unconsumed doorbells; a new
    campaign's records queue behind them. Their claims find nothing to send, so they need no
    lane room and go MAX_CLAIM_RECIPIENTS at a time, not half a lane (50) at a time. The
    doorbells here ring for one recipient each, as contract v1 wrote them: the worst case."""
    seed_users(settings.pg_dsn, 3_000)
    put_template(settings)
    cid = new_campaign(settings, rate=0)
    rows = _rows(settings, cid)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        CampaignStore(conn).transition(cid, "cancelled", "test")
    records = _consumed(settings, cid, 0, rows, block=1)

    async def scenario() -> tuple[int, dict[int, int]]:
        runtime = Runtime(settings)
        try:
            offsets = await runtime.offsets(Assignment.of(settings.topic_recipients, [0]))
            assert offsets == {0: 0}
            sender = await runtime.ensure_started()
            await sender.reassign({0})
            for i in range(0, len(records), 500):  # Faust's batches (TAKE_MAX)
                await sender.handle(records[i : i + 500])
            deadline = time.monotonic() + 20
            stored: dict[int, int] = {}
            while time.monotonic() < deadline:
                stored = dict(  # a seek that is not an assignment: no new epoch
                    await runtime.offsets(Assignment(settings.topic_recipients, (0,), frozenset()))
                )
                if stored.get(0) == len(records):
                    break
                await asyncio.sleep(0.1)
            return sender.stats["claim_rounds"], stored
        finally:
            await runtime.stop()

    rounds, stored = run_bounded(scenario())
    assert stored == {0: len(records)}, stored  # every doorbell consumed, offset advanced
    assert rounds <= len(records) // MAX_CLAIM_RECIPIENTS + 2, rounds  # not len(records) / 50
    assert statuses(settings, cid).get("sending", 0) == 0


@dataclass
class RecordingFlow:
    """Stands in for the Faust consumer's fetch control (streams.app.FaustPartitionFlow)."""

    events: list[tuple[str, frozenset[int]]] = field(default_factory=list)

    def pause(self, partitions: set[int]) -> None:
        self.events.append(("pause", frozenset(partitions)))

    def resume(self, partitions: set[int]) -> None:
        self.events.append(("resume", frozenset(partitions)))


def test_a_full_partition_is_paused_not_waited_for_and_resumed_once_drained(
    settings: Settings,
) -> None:
    """With a PartitionFlow the agent never waits for one partition: waiting starved the
    others behind it for 24 s in a 1M bench (docs/decisions.md). The full partition stops
    being fetched instead, and is fetched again once its feeder has claimed it down to
    RESUME_AT (streams/sender.py); nothing queued is lost."""
    seed_users(settings.pg_dsn, 4_500)
    put_template(settings)
    cid = new_campaign(settings, rate=0)
    rows = _rows(settings, cid)
    many = rows[: PAUSE_ABOVE + 200]
    assert len(many) == PAUSE_ABOVE + 200

    async def scenario() -> tuple[int, list[tuple[str, frozenset[int]]], int]:
        flow = RecordingFlow()
        runtime = Runtime(settings, flow)
        try:
            await runtime.offsets(Assignment.of(settings.topic_recipients, [0, 1]))
            sender = await runtime.ensure_started()
            await sender.reassign({0, 1})
            await asyncio.wait_for(sender.handle(_consumed(settings, cid, 0, many)), timeout=5)
            queued_on_return = sender._unclaimed_weight[0]
            claimed = await _until_claimed(settings, cid, [seq for seq, _ in many], 30)
            return queued_on_return, list(flow.events), claimed
        finally:
            await runtime.stop()

    queued_on_return, events, claimed = run_bounded(scenario())
    # Without a flow the agent waits until the partition is down to UNCLAIMED_PER_PARTITION.
    assert queued_on_return > UNCLAIMED_PER_PARTITION, queued_on_return
    paused = next(i for i, (kind, parts) in enumerate(events) if kind == "pause" and 0 in parts)
    assert any(kind == "resume" and 0 in parts for kind, parts in events[paused:]), events
    assert not any(kind == "pause" and 1 in parts for kind, parts in events), events
    assert claimed == len(many), claimed
