"""The campaign sender: Kafka doorbells → claim in PostgreSQL → paced SES SendBulkEmail calls.

`handle(batch)` runs in the Faust agent: it decodes each record once and queues it for its
partition. A feeder per partition takes half a lane of records whenever its lane has room, and
the chunks ready at the same moment go in ONE transaction that dead-letters poison, advances
the fenced offsets and claims the rows (sinks.offsets: only recipients of doorbells at or above
a partition's stored offset, and only under the epoch of its current owner). Claimed rows go
to the lane of their partition. A claim that finds a partition taken by another worker (this
one lost it, maybe while paused, and has not heard yet) stops that partition here until the
group assigns it to this worker again.
Each lane (one asyncio task per partition) paces its calls (R/P per campaign), re-checks the
campaign right before each call, calls SES in a thread (bounded), and records the outcome in
one statement. Offsets are advanced at claim time, so lanes may run
concurrently without breaking offset order.

Failure policy (marketing is at-most-once):
- no answer from SES (timeout, 5xx) → `unknown`, never resent automatically;
- throttled / transient → out of their call, retried in the lane with backoff + jitter, then
  left `pending` (requeue) for reconcile;
- paused/cancelled before the call → rows released (`pending` requeue / `cancelled`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from flashsend import metrics
from producers.dlq import DeadLetter, DeadLetterFailed, DeadLetterProducer
from schemas.doorbell import (
    DOORBELL_BATCH_RECORDS,
    DOORBELL_BLOCK,
    doorbell_problem,
    doorbell_seqs,
)
from schemas.serde import AvroCodec, SerdeError, wait_for_writer_schemas
from sinks.campaign_store import SETTLED
from sinks.recipient_store import (
    CampaignNotSending,
    ClaimedRecipient,
    ClaimOutcome,
    LiveCampaign,
    OfferedKey,
    PartitionSpan,
    RecipientStore,
    RowResult,
    StoreUnavailable,
)
from sinks.ses import BulkEntry, CallClock, EntryStatus, SesCallFailed, SesSender
from streams.call_outcome import CallOutcome
from streams.campaign_state import CampaignCache
from streams.channel import Channel
from streams.rules.addresses import is_valid_email
from streams.rules.backoff import backoff_delay
from streams.rules.call_split import Bisection
from streams.rules.outcomes import (
    Outcome,
    classify_call_error,
    is_campaign_fatal,
    is_entry_throttle,
    is_refused_unsent,
    is_throttle,
    map_bulk_response,
)
from streams.rules.share_plan import share_plan
from streams.rules.throttle import Aimd, WindowPacer, split_rate, takeover_hold_until

log = logging.getLogger("flashsend.sender")

MAX_ENTRIES = 50
# The window SES's MaxSendRate is counted over: each lane keeps its share in any such window.
WINDOW_S = 1.0
# A lane held by a lagging feedback agent looks again this often (the gate is polled 4x/s).
FEEDBACK_WAIT_S = 0.1
HALT_RECHECK_S = 0.1  # a lane whose campaign left 'sending' unseen waits this before a retry
# How long a revocation waits for the answers of calls in flight (bounded: it holds up the
# rebalance of the whole group).
SETTLE_S = 2.0
# A stopping worker's wait for its calls in flight: below the worker's 20-s shutdown grace
# (flashsend.faust_worker), above a call's answer under load.
DRAIN_S = 10.0
# A stopping worker's wait for its claim round in progress (a claim transaction, retried
# while the database is unreachable).
CLAIM_FINISH_S = 3.0
# A lane holding less than a full call waits up to this long for more rows: a 5-entry call
# costs boto3, the stand-in and the result statement nearly as much as a 50-entry one, and
# partial calls kept a 2-worker pipeline at ~11 entries per call and ~1,200 recipients/s.
LINGER_S = 0.25
# A lane admits a call this much ahead of the window's room, learnt from how long admission
# to the call's request takes (a database round trip, a busy event loop), at most LEAD_CAP_S.
LEAD_WEIGHT = 0.25
LEAD_CAP_S = 0.1
# A call leaves the event loop up to this long before its window has room, and its thread
# waits out the rest right before the request goes out: the hop to the thread, serialising
# and signing then happen before the room instead of inside the window's count.
HANDOFF_S = 0.05
# A partition's share of a campaign's limit moves between partitions (streams.rules.share_plan); a
# lane takes the least it had from this long ago on: the window, plus the hand-off, plus
# 0.25 s for a request to reach SES and 0.1 s for the workers' reads of the sending clock.
PLAN_HOLD_S = WINDOW_S + HANDOFF_S + 0.25 + 0.1
# Consumed-but-unclaimed recipients a partition may hold before the agent stops taking
# batches. Two producer batches (schemas.doorbell.DOORBELL_BATCH_RECORDS doorbells of
# DOORBELL_BLOCK): a fetch can bring one partition a whole batch at once, and with a bound
# below that the agent stopped for it while the other partitions' lanes ran dry (at 600/s: 5 s
# idle at the start of every campaign). Only without a PartitionFlow (see below).
UNCLAIMED_PER_PARTITION = 2 * DOORBELL_BATCH_RECORDS * DOORBELL_BLOCK
# With a PartitionFlow, a partition holding more than PAUSE_ABOVE unclaimed recipients stops
# being fetched, and is fetched again once it holds RESUME_AT or fewer; the agent never waits
# for one partition. Blocking the whole stream for one full partition starved the others:
# behind it, Faust's buffer filled with that partition's doorbells, which drained at its one
# lane's pace while the other lanes ran dry (five partitions of a worker silent for 24 s in a
# 1M bench, docs/decisions.md). RESUME_AT is a second of an unlimited lane's sending
# (~1,500/s): Faust's fetch loop sleeps a second when every partition is paused.
PAUSE_ABOVE = 6 * DOORBELL_BATCH_RECORDS * DOORBELL_BLOCK
RESUME_AT = PAUSE_ABOVE // 2
# With a PartitionFlow the agent still waits if a partition holds this many (records fetched
# before the pause keep arriving; this bounds what a misbehaving fetcher could pile up).
UNCLAIMED_HARD_LIMIT = 4 * PAUSE_ABOVE
# Recipients per claim transaction when most belong to finished campaigns. Their claim finds
# nothing to send (only the offset advances), so they need no lane room: after a cancelled
# 1M campaign, workers skipped its ~770k leftover doorbells 25 at a time for a minute before a
# new campaign's first send.
MAX_CLAIM_RECIPIENTS = 2000


class Record(Protocol):
    """What the sender needs from a consumed Kafka record (a Faust message fits)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


class PartitionFlow(Protocol):
    """Stops and restarts fetching of the sender's partitions (the Faust consumer's)."""

    def pause(self, partitions: set[int]) -> None: ...
    def resume(self, partitions: set[int]) -> None: ...


@dataclass(frozen=True, slots=True)
class Queued:
    """A consumed record, decoded once: `doorbell` and the seqs it rings for, or the reason
    it is poison."""

    rec: Record
    doorbell: dict[str, Any] | None
    error: SerdeError | None
    seqs: list[int]

    @property
    def weight(self) -> int:
        """Recipients it stands for in the unclaimed bound (poison: one)."""
        return len(self.seqs) or 1

    def dead_letter(self, reason: str, detail: str) -> DeadLetter:
        return DeadLetter.of(self.rec, reason, detail)


def decode_doorbell(codec: AvroCodec, rec: Record) -> Queued:
    """The record decoded, or why it is poison. Never raises (a raise would stop the worker,
    and the restart would meet the same record); its writer schema must be cached
    (`wait_for_writer_schemas`)."""
    try:
        doorbell = codec.decode(rec.value)
        seqs = doorbell_seqs(doorbell)
        problem = doorbell_problem(doorbell, seqs)
    except SerdeError as exc:
        return Queued(rec, None, exc, [])
    except Exception as exc:
        return Queued(rec, None, SerdeError("bad_record", f"{type(exc).__name__}: {exc}"), [])
    if problem is not None:
        return Queued(rec, None, SerdeError("bad_doorbell", problem), [])
    return Queued(rec, doorbell, None, seqs)


@dataclass(frozen=True)
class SenderConfig:
    partitions: int
    # Claimed rows a lane holds: two full calls, so a whole next call is queued while the
    # feeder claims the rows after it. With one call's worth, a lane whose calls were a little
    # bigger than what a refill left it waited on claims with room in its window (0.94 of the
    # limit at 2,222/s against 0.99). A crash returns them to pending once their lease runs out.
    lane_capacity: int = 2 * MAX_ENTRIES
    max_inflight_calls: int = 12  # SES calls in flight per worker
    window_slack: float = 0.0  # a lane's window over its budget, for latency (WindowPacer)
    max_retries: int = 4  # per call, for throttles and transient entries
    retry_base_s: float = 0.2
    retry_cap_s: float = 5.0
    store_retry_cap_s: float = 5.0

    def __post_init__(self) -> None:
        # The feeder claims half a lane once it fits: a lane short of a call must have room for
        # that, or it sends short calls while its window has room for full ones.
        if self.lane_capacity < 2 * MAX_ENTRIES:
            raise ValueError(
                f"lane_capacity must hold two full calls ({2 * MAX_ENTRIES}), "
                f"got {self.lane_capacity}"
            )


HeadersFor = Callable[[ClaimedRecipient], Mapping[str, str]]


def _no_headers(_: ClaimedRecipient) -> Mapping[str, str]:
    return {}


class Lane:
    """Sends the claimed rows of one partition, one SES call at a time."""

    def __init__(self, partition: int, sender: CampaignSender) -> None:
        self.partition = partition
        self._sender = sender
        self._rows: deque[ClaimedRecipient] = deque()
        self._has_rows = asyncio.Event()
        self._more = asyncio.Event()  # set by every put (wakes a lingering lane)
        self._oldest_at = 0.0  # when the oldest queued row arrived
        self._room_wanted = False  # the agent waits for room: send what we have
        self._has_room = asyncio.Event()
        self._has_room.set()
        self._pacers: dict[int, tuple[WindowPacer, Aimd]] = {}
        # When the partition was taken over: its previous owner may have spent the whole
        # budget in the second before, so pacers of campaigns sendable by then count the
        # window as full until a second after it (takeover_hold_until).
        self._assigned_at = float("-inf")
        # Set between a revocation and the assignment that follows it: no call may start, as
        # the partition may be about to move (it holds its pacers: a kept partition goes on).
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._task: asyncio.Task[None] | None = None
        self._inflight: list[ClaimedRecipient] = []
        self._in_call = False
        self._lead = 0.0  # smoothed time from admission to rows entered in their call
        # Set when the partition moved to another worker: that worker now owns the partition's
        # rate budget, so this lane must not send anything more (queued rows are released).
        self.revoked = False
        # Set by a graceful stop: the call in flight finishes and its outcome is recorded,
        # no other call starts, and the task ends.
        self._draining = False

    @property
    def backlog(self) -> int:
        return len(self._rows) + len(self._inflight)

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"lane-{self.partition}")

    async def wait_room(self, n: int) -> None:
        """Wait until n more rows fit. Called BEFORE claiming, so rows are never claimed (and
        left 'sending' by a crash) faster than this lane can send them."""
        capacity = self._sender.config.lane_capacity
        while self._rows and len(self._rows) + n > capacity and not self.revoked:
            self._has_room.clear()
            self._room_wanted = True
            self._more.set()  # a lingering lane stops waiting for a fuller call
            await self._has_room.wait()
        self._room_wanted = False

    def put(self, rows: Sequence[ClaimedRecipient]) -> None:
        if not self._rows:
            self._oldest_at = time.monotonic()
        self._rows.extend(rows)
        self._has_rows.set()
        self._more.set()

    async def revoke(self) -> None:
        self.revoked = True
        self.resume()
        await self._release_queued("rebalanced")

    def assign(self) -> None:
        """Newly assigned: fresh pacers whose window counts as full for its first second (the
        previous owner may have just spent the partition's budget), except for campaigns
        whose rows became sendable after the assignment: nobody sent those before us."""
        self.revoked = False
        self._pacers.clear()
        self._assigned_at = time.monotonic()
        self.resume()

    def suspend(self) -> None:
        """A rebalance began: start no call until the assignment says whether we keep it. A
        revoked lane starts none anyway; suspended, it would hold the rows of the call it
        has in hand until the partition came back, since an assignment without the
        partition revokes only lanes not revoked yet."""
        if not self.revoked:
            self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    async def settle(self) -> None:
        """Wait for the call in flight (if any) to be answered."""
        while self._in_call:
            await asyncio.sleep(0.005)

    async def _release_queued(self, reason: str) -> None:
        queued = list(self._rows)
        self._rows.clear()
        self._has_rows.clear()
        self._has_room.set()
        for cid, group in _by_campaign(queued).items():
            await self._sender.record_rows(cid, group, "pending", reason)

    async def drain(self) -> None:
        while self._rows or self._inflight:
            await asyncio.sleep(0.02)

    async def stop(self, drain_s: float = 0.0) -> None:
        """Stop sending and release the rows that never reached SES (safe: nothing was sent
        for them). Within `drain_s`, the call in flight is answered and its outcome recorded
        first, so a stop leaves none of this lane's rows in doubt; a lane still busy after
        `drain_s` is cancelled where it stands (its call's rows are settled by reconcile and
        SES's events)."""
        self.revoked = True  # wakes an agent waiting for room; later puts are released
        self._draining = True
        self._has_room.set()
        self.resume()
        self._has_rows.set()  # an idle lane wakes up to end
        self._more.set()
        if self._task is not None:
            if drain_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._task), drain_s)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._release_queued("worker_stopped")

    def _call_size(self) -> int:
        """Entries in the next call: a full call of the campaign's channel unless the pacer
        wants smaller bursts (counted in the campaign's rate unit: rows of unequal cost fill a
        call up to a call's worth of units)."""
        first = self._rows[0]
        campaign = self._sender.campaigns.get(first.campaign_id)
        if campaign is None or campaign.status != "sending":
            # No pacer before the cache shows it sending: one made from a stale copy would
            # not know when its rows became sendable, and hold its first second for nothing.
            return MAX_ENTRIES
        channel = self._sender.channels.get(campaign.channel)
        full = MAX_ENTRIES if channel is None else channel.max_entries
        pacer = self._pacer(campaign, self._lead)[0]
        cost = self._sender.row_cost(campaign)
        if cost is None:
            return pacer.call_size(full)
        head = (r for r in self._rows if _same_call(r, first))
        return pacer.call_rows([cost(r) for r in itertools.islice(head, full)], full)

    async def _fill(self) -> None:
        """Wait, at most LINGER_S after the oldest queued row arrived, for a full call. Never
        longer than the lane can hold (the agent claims only when there is room)."""
        target = min(self._call_size(), self._sender.config.lane_capacity)
        while (
            self._rows and len(self._rows) < target and not self.revoked and not self._room_wanted
        ):
            remaining = self._oldest_at + LINGER_S - time.monotonic()
            if remaining <= 0:
                return
            self._more.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._more.wait(), remaining)

    def _requeue(self, rows: Sequence[ClaimedRecipient]) -> None:
        """Put rows taken for a call back at the head of the queue (they keep their turn)."""
        self._rows.extendleft(reversed(rows))
        self._has_rows.set()

    def _take_call(self) -> list[ClaimedRecipient]:
        first = self._rows[0]
        size = self._call_size()
        call: list[ClaimedRecipient] = []
        rest: deque[ClaimedRecipient] = deque()
        while self._rows and len(call) < size:
            row = self._rows.popleft()
            (call if _same_call(row, first) else rest).append(row)
        self._requeue(list(rest))
        self._oldest_at = time.monotonic()  # the rows left behind start a new wait
        self._has_room.set()
        if not self._rows:
            self._has_rows.clear()
        return call

    def _learn_lead(self, took: float) -> None:
        """From admission (or the end of the wait for room) to rows entered in the call."""
        self._lead += LEAD_WEIGHT * (min(LEAD_CAP_S, max(0.0, took)) - self._lead)

    async def _wait_room(
        self, campaign: LiveCampaign, units: int
    ) -> tuple[float, WindowPacer] | None:
        """Wait until the window has room for the call admitted ahead of time, or until it
        will within HANDOFF_S, and return when it has (the instant the request may leave) with
        the pacer that said so, which counts the call; None when the partition moved
        meanwhile (nothing was sent: its rows go back to pending). The budget is the plan's
        for the request's instant, not the admission's."""
        while True:
            if self.revoked:
                return None
            pacer = self._pacer(campaign, HANDOFF_S)[0]
            now = time.monotonic()
            gap = pacer.until_free(units, now)
            if gap <= HANDOFF_S:
                return now + gap, pacer
            await asyncio.sleep(gap - HANDOFF_S)

    def _pacer(self, campaign: LiveCampaign, ahead: float) -> tuple[WindowPacer, Aimd]:
        """The campaign's pacer on this lane, its budget the least the share plan gives this
        partition from PLAN_HOLD_S ago on the sending clock to `ahead` seconds from now
        (streams.rules.share_plan), or the AIMD rate's share while SES throttles."""
        s = self._sender
        partitions = s.config.partitions
        clock = s.campaigns.sending_clock(campaign)
        share = split_rate(s.campaigns.rate_at(campaign, clock), partitions)
        entry = self._pacers.get(campaign.id)
        if entry is None:
            slack = s.config.window_slack
            entry = (WindowPacer(0, window_s=WINDOW_S, slack=slack), Aimd(ceiling=share))
            since = s.campaigns.sendable_since(campaign.id)
            entry[0].hold_until(takeover_hold_until(self._assigned_at, since, WINDOW_S))
            self._pacers[campaign.id] = entry
        elif entry[1].ceiling != share:
            # A new rate (a ramp's step) keeps the window: what it holds stays counted, so a
            # step up never adds a fresh second's budget on top of the last one.
            entry = (entry[0], Aimd(ceiling=share))
            self._pacers[campaign.id] = entry
        pacer, aimd = entry
        start, end = clock - PLAN_HOLD_S, clock + ahead
        if aimd.rate < share:
            rates = {aimd.rate * partitions}
        else:  # a ramp's step within the interval: the least of both plans
            rates = {s.campaigns.rate_at(campaign, start), s.campaigns.rate_at(campaign, end)}
        weights = campaign.partition_weights
        pacer.set_budget(
            min(
                share_plan(rate, partitions, weights).budget_over(self.partition, start, end)
                for rate in rates
            )
        )
        return entry

    async def _run(self) -> None:
        while not self._draining:
            await self._has_rows.wait()
            if self._draining:
                return
            await self._fill()
            if not self._rows:  # released while lingering (revoked, stopped)
                continue
            call = self._take_call()
            if not call:
                continue
            self._inflight = call
            try:
                await self._send_call(call)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "lane %s: unexpected error; rows stay 'sending' for reconcile", self.partition
                )
            finally:
                self._inflight = []

    async def _send_call(self, rows: list[ClaimedRecipient]) -> None:
        """Send `rows` (one campaign's), as many calls as the pacer's window allows, retrying
        throttled and transient entries with backoff."""
        s = self._sender
        cid = rows[0].campaign_id
        attempt = 0
        due: float | None = None  # when the lane's last wait for room was to end
        while rows:
            if not self._resumed.is_set():
                await self._resumed.wait()
            if self.revoked:
                reason = "worker_stopped" if self._draining else "rebalanced"
                await s.record_rows(cid, rows, "pending", reason)
                return
            campaign = s.campaigns.get(cid)
            if campaign is None or campaign.status != "sending" or not s.campaigns.is_fresh():
                await s.release(cid, rows, campaign.status if campaign else "gone")
                return
            if s.campaigns.feedback.closed:
                # The feedback agent is behind: a complaint spike would be seen too late.
                metrics.add_throttle_wait("feedback", FEEDBACK_WAIT_S)
                s.stats["feedback_waits"] += 1
                await asyncio.sleep(FEEDBACK_WAIT_S)
                continue  # everything is checked again: paused, revoked, rate changed
            pacer, aimd = self._pacer(campaign, self._lead)
            # None: every row costs one unit of the rate (email; SMS limited in messages).
            cost = s.row_cost(campaign)
            # Each row's cost is rendered once per attempt: admission and the count share it.
            costs = None if cost is None else {r.seq: cost(r) for r in rows}
            # Admitted `lead` ahead of the room: the call's database round trip and the event
            # loop's lateness happen before the room is there, not after (until_free below).
            now = time.monotonic()
            if costs is None:
                admitted, wait = pacer.admit(len(rows), now, self._lead)
            else:
                admitted, wait = pacer.admit_costs([costs[r.seq] for r in rows], now, self._lead)
            if not admitted:
                metrics.add_throttle_wait("campaign", wait)
                due = now + wait
                await asyncio.sleep(wait)
                continue  # everything is checked again: paused, revoked, rate changed
            # The lane's lag counts from when its wait for room was to end, if it just was.
            asked = due if due is not None and now - LEAD_CAP_S <= due <= now else now
            due = None
            batch, rows = rows[:admitted], rows[admitted:]
            if rows and attempt == 0:
                # The window had room for part of the call: the rest joins the next call, so
                # calls keep their size and tile the budget (sent as a call of their own, a
                # few rows would take a whole call's turn, and the lane would fall behind).
                self._requeue(rows)
                rows = []
            self._in_call = True
            counted = 0
            not_before = float("-inf")  # no request leaves earlier: the window's room
            outcome: CallOutcome | None = None
            try:
                try:
                    batch = await s.enter_call(cid, batch)
                except CampaignNotSending as halted:
                    # Committed before the call entered: none of `batch` was sent. The check
                    # above sees the campaign's new status once it is refreshed.
                    rows = batch + rows
                    await s.campaign_left_sending(cid, str(halted))
                    continue
                if batch:
                    units = len(batch) if costs is None else sum(costs[r.seq] for r in batch)
                    if units:  # rows costing nothing are skipped without a request
                        self._learn_lead(time.monotonic() - asked)
                        room = await self._wait_room(campaign, units)
                        if room is None:
                            back = [*batch, *rows]  # nothing of them was sent
                            await s.record_rows(cid, back, "pending", "rebalanced")
                            return
                        # Counted from here: the request leaves no earlier than the room
                        # (its thread waits for it).
                        not_before, pacer = room
                        counted = units
                        pacer.started(counted, max(time.monotonic(), not_before))
                    outcome = await s.call_ses(campaign, batch, not_before)
            finally:
                self._in_call = False
                if counted:
                    answered_at = outcome.answered_at if outcome is not None else None
                    pacer.finished(counted, answered_at or time.monotonic())

            if outcome is None:
                continue
            now = time.monotonic()
            if outcome.throttled:
                aimd.on_throttle(now)
            elif aimd.ceiling > 0 and aimd.rate < aimd.ceiling:
                aimd.on_success(now)
            # One claim per row in `batch` (enter_call): each outcome under its row's claim.
            claim_of = {r.seq: r.attempt for r in batch}
            recorded = await s.record(cid, outcome.final, [claim_of[r.seq] for r in outcome.final])
            if recorded < len(outcome.final):
                log.warning(
                    "campaign %s: %d outcome(s) of a call not recorded: their rows were no "
                    "longer claimed here (their lease expired during the call)",
                    cid,
                    len(outcome.final) - recorded,
                )
            if outcome.pause_reason:
                await s.pause(cid, outcome.pause_reason)
            if outcome.retry:
                attempt += 1
                if attempt > s.config.max_retries:
                    reason = f"retry_exhausted:{outcome.retry_reason}"
                    await s.record_rows(cid, outcome.retry, "pending", reason)
                else:
                    # Nothing of them was sent: out of their call while they wait, so a crash
                    # now leaves them pending for another worker, not unknown.
                    await s.leave_call(cid, outcome.retry)
                    rows = outcome.retry + rows
                    await asyncio.sleep(
                        backoff_delay(
                            attempt, base=s.config.retry_base_s, cap=s.config.retry_cap_s, rng=s.rng
                        )
                    )


def _same_call(row: ClaimedRecipient, first: ClaimedRecipient) -> bool:
    """One template per SendBulkEmail: an A/B test's variants go in calls of their own."""
    return row.campaign_id == first.campaign_id and row.variant == first.variant


def replacement_data(row: ClaimedRecipient) -> dict[str, Any]:
    """The template's values for one recipient: {{first_name}}, {{user_id}}, and
    {{promo_code}} when the campaign has a pool (the code bound at the claim)."""
    data: dict[str, Any] = {"first_name": row.first_name or "there", "user_id": row.user_id}
    if row.promo_code is not None:
        data["promo_code"] = row.promo_code
    return data


def _refusal_reason(exc: SesCallFailed) -> str:
    """SES's code and message for an entry it refused (the message names the address)."""
    return f"{exc.code}: {exc.message}" if exc.message else str(exc.code)


def _entry_tags(r: ClaimedRecipient) -> dict[str, str]:
    """SES message tags: every event SES publishes for the mail carries them back (the
    feedback agent finds the row by campaign + seq, an A/B test's counters by variant)."""
    if r.variant is None:
        return {"seq": str(r.seq)}
    return {"seq": str(r.seq), "variant": r.variant}


def _by_campaign(rows: Sequence[ClaimedRecipient]) -> dict[int, list[ClaimedRecipient]]:
    grouped: dict[int, list[ClaimedRecipient]] = {}
    for row in rows:
        grouped.setdefault(row.campaign_id, []).append(row)
    return grouped


class CampaignSender:
    def __init__(
        self,
        *,
        config: SenderConfig,
        store: RecipientStore,
        ses: SesSender,
        campaigns: CampaignCache,
        codec: AvroCodec,
        dlq: DeadLetterProducer,
        headers_for: HeadersFor = _no_headers,
        rng: random.Random | None = None,
        flow: PartitionFlow | None = None,
        channels: Mapping[str, Channel] | None = None,
    ) -> None:
        self.config = config
        # Campaigns of these channels are sent through them; email's calls are made here.
        self.channels = dict(channels or {})
        self.flow = flow
        self._paused: set[int] = set()  # partitions this sender asked `flow` to pause
        self.store = store
        self.ses = ses
        self.campaigns = campaigns
        self.codec = codec
        self.dlq = dlq
        self.headers_for = headers_for
        self.rng = rng or random.Random()
        self.lanes: dict[int, Lane] = {}
        self._executor = ThreadPoolExecutor(
            max_workers=config.max_inflight_calls, thread_name_prefix="ses"
        )
        self._calls = asyncio.Semaphore(config.max_inflight_calls)
        # Consumed records not claimed yet, per partition, and the tasks claiming them.
        self._unclaimed: dict[int, deque[Queued]] = {}
        self._unclaimed_weight: dict[int, int] = {}  # recipients in each _unclaimed queue
        self._last_queued: dict[int, int] = {}
        self._feeders: dict[int, asyncio.Task[None]] = {}
        self._taken = asyncio.Event()  # a feeder took records (or failed): the agent may go on
        self._failed: BaseException | None = None
        self._settled: set[int] = set()  # campaigns finished long ago (statuses are final)
        # Chunks whose lane has room, waiting for the next claim transaction (_claim_together).
        self._ready: list[tuple[list[Queued], asyncio.Future[None]]] = []
        self._claimer: asyncio.Task[None] | None = None
        # Partitions a claim found owned by another worker, with the epoch this worker held:
        # their records are dropped until this worker holds a newer epoch (is assigned them).
        self._lost: dict[int, int | None] = {}
        self.stats: dict[str, int] = {
            "claim_rounds": 0,
            "claimed": 0,
            "skipped": 0,
            "fenced": 0,
            "codeless": 0,  # claimed when the promo pool was empty: released, campaign paused
            "overtaken": 0,
            "dead": 0,
            "calls": 0,
            "sent": 0,
            "failed": 0,
            "unknown": 0,
            "refused_calls": 0,  # calls SES refused whole, then split (streams.rules.call_split)
            "registry_retries": 0,  # schema registry lookups retried (it did not answer)
            "feedback_waits": 0,  # a lane's waits while the feedback agent was behind
        }

    # ---- the agent side -------------------------------------------------------------------

    async def handle(self, records: Sequence[Record]) -> None:
        """Take one consumed batch: queue its records per partition for that partition's
        feeder, and return once no partition holds more than UNCLAIMED_PER_PARTITION unclaimed
        records (back-pressure on the Faust stream). Retries database and DLQ outages itself.

        A feeder claims its partition's records in order, in chunks of half a lane, each chunk
        only once its lane has room: a crash leaves at most one lane of claimed rows per
        partition, which go back to pending when their lease runs out (they never entered a
        call; a lane's call in flight becomes `unknown`, never resent), and
        queued-but-unclaimed records are simply consumed again (the offset stored in Postgres
        advances only with a claim). Partitions go independently, so a full lane (a slow rate
        share) holds back only its own partition; chunks ready together share one claim
        transaction. Writer schemas not cached yet are looked up first, waiting out a
        registry outage (a good doorbell is never dead-lettered for it)."""
        self._raise_if_failed()
        self.stats["registry_retries"] += await wait_for_writer_schemas(
            [self.codec],
            [r.value for r in records],
            cap_s=self.config.store_retry_cap_s,
            rng=self.rng,
        )
        lost = self._lost
        for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
            p = rec.partition
            if lost and p in lost and self._lost_now(p):
                continue  # another worker owns it now: its records are the new owner's
            if rec.offset <= self._last_queued.get(p, -1):
                continue  # redelivered after a re-seek while still queued here
            self._last_queued[p] = rec.offset
            item = self._decode(rec)
            self._unclaimed.setdefault(p, deque()).append(item)
            self._unclaimed_weight[p] = self._unclaimed_weight.get(p, 0) + item.weight
            feeder = self._feeders.get(p)
            if feeder is None or feeder.done():
                self._feeders[p] = asyncio.create_task(self._feed(p), name=f"feeder-{p}")
        self._sync_flow()
        limit = UNCLAIMED_PER_PARTITION if self.flow is None else UNCLAIMED_HARD_LIMIT
        while any(w > limit for w in self._unclaimed_weight.values()):
            self._taken.clear()
            await self._taken.wait()
            self._raise_if_failed()

    def _sync_flow(self) -> None:
        """Pause the partitions holding more than PAUSE_ABOVE unclaimed recipients, resume
        paused ones down to RESUME_AT. The pauses held are asked again every time: Faust's own
        buffer control, or a rebalance, may have resumed a partition meanwhile."""
        if self.flow is None:
            return
        weights = self._unclaimed_weight
        drained = {p for p in self._paused if weights.get(p, 0) <= RESUME_AT}
        self._paused = {p for p, w in weights.items() if w > PAUSE_ABOVE} | (self._paused - drained)
        if self._paused:
            self.flow.pause(self._paused)
        if drained:
            self.flow.resume(drained)

    def _decode(self, rec: Record) -> Queued:
        return decode_doorbell(self.codec, rec)

    def _needs_lane(self, item: Queued) -> bool:
        """False when the claim cannot hand the row to a lane: poison (dead-lettered), or a
        doorbell of a campaign that is cancelled, done or failed."""
        if item.doorbell is None:
            return False
        cid = item.doorbell["campaign_id"]
        if cid in self._settled:
            return False
        campaign = self.campaigns.get(cid)
        return campaign is None or campaign.status not in SETTLED

    def _raise_if_failed(self) -> None:
        if self._failed is not None:
            raise RuntimeError("a claim feeder failed") from self._failed

    async def _feed(self, partition: int) -> None:
        # Half a lane per chunk: the lane still has half a lane of work queued while the next
        # chunk is claimed, so it never runs dry waiting for the agent.
        size = max(1, self.config.lane_capacity // 2)
        queue = self._unclaimed[partition]
        try:
            while queue:
                await self._lane(partition).wait_room(self._next_chunk(queue, size)[1])
                # Again: the queue may have been forgotten (the partition moved) meanwhile.
                count, _, taken = self._next_chunk(queue, size)
                if not count:
                    continue
                chunk = [queue.popleft() for _ in range(count)]
                self._unclaimed_weight[partition] -= taken
                self._taken.set()
                self._sync_flow()
                await self._claim_together(chunk)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug, not an outage (_retry absorbs those)
            log.exception("claim feeder of partition %s failed; stopping the worker", partition)
            self._failed = exc
            self._taken.set()

    def _next_chunk(self, queue: deque[Queued], size: int) -> tuple[int, int, int]:
        """The records the next claim takes from the head of `queue`: until `size` recipients
        need a lane (or MAX_CLAIM_RECIPIENTS were taken). Returns (records, recipients for the
        lane, recipients)."""
        count = for_lane = taken = 0
        for item in queue:
            if for_lane >= size or taken >= MAX_CLAIM_RECIPIENTS:
                break
            count += 1
            taken += item.weight
            for_lane += len(item.seqs) if self._needs_lane(item) else 0
        return count, for_lane, taken

    def _forget_unclaimed(self, partition: int) -> None:
        """The partition moved away: its queued records are the new owner's to consume."""
        queue = self._unclaimed.get(partition)
        if queue:
            queue.clear()
        self._unclaimed_weight[partition] = 0  # a feeder waiting for room may still read it
        self._last_queued.pop(partition, None)
        # Not resumed: it is not ours any more (Faust forgets the pause of a revoked partition).
        self._paused.discard(partition)
        self._taken.set()

    async def _claim_together(self, chunk: list[Queued]) -> None:
        """Claim `chunk` in the next claim transaction, with every other chunk ready by then
        (one transaction per round of ready partitions, not one per partition)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ready.append((chunk, done))
        if self._claimer is None or self._claimer.done():
            self._claimer = asyncio.create_task(self._claim_ready(), name="claimer")
        await done

    async def _claim_ready(self) -> None:
        """The claimer: runs while chunks are ready. An error fails every waiting chunk (the
        agent then crashes the worker; the offsets in Postgres make the restart exact)."""
        while self._ready:
            await asyncio.sleep(0)  # partitions whose lane has room join this round
            round_, self._ready = self._ready, []
            try:
                await self._claim_round([rec for c, _ in round_ for rec in c])
            except BaseException as exc:
                cancelled = isinstance(exc, asyncio.CancelledError)
                for _, fut in round_ + self._ready:
                    if fut.done():
                        continue
                    if cancelled:
                        fut.cancel()
                    else:
                        fut.set_exception(exc)
                self._ready = []
                if cancelled:
                    raise
                return
            for _, fut in round_:
                if not fut.done():
                    fut.set_result(None)

    async def _claim_round(self, items: Sequence[Queued]) -> None:
        self.stats["claim_rounds"] += 1
        spans: dict[int, PartitionSpan] = {}
        keys: dict[int, list[OfferedKey]] = {}
        dead: list[DeadLetter] = []
        for item in items:
            rec, doorbell = item.rec, item.doorbell
            span = spans.get(rec.partition)
            spans[rec.partition] = PartitionSpan(
                rec.partition,
                rec.offset if span is None else min(span.first_offset, rec.offset),
                rec.offset if span is None else max(span.last_offset, rec.offset),
            )
            if doorbell is None:
                assert item.error is not None
                dead.append(item.dead_letter(item.error.reason, str(item.error)))
                continue
            cid = doorbell["campaign_id"]
            keys.setdefault(rec.partition, []).extend((rec.offset, (cid, seq)) for seq in item.seqs)
        unknown = await self._retry(self._unknown_campaigns, keys)
        if unknown:
            keys, dead = self._dead_for_unknown(items, keys, unknown, dead)
        if dead:
            await self._retry(self.dlq.publish, dead)
            self.stats["dead"] += len(dead)
            metrics.count_dead_letters(self.dlq.topic, (d.reason for d in dead))
        while spans:
            outcome = await self._retry(self.store.claim_batch, list(spans.values()), keys)
            await self._hand_to_lanes(outcome, keys)
            # Refused under an epoch this worker has replaced since (it was assigned the
            # partition again while the claim ran): its records are this worker's again, and
            # the re-seek skipped them as still queued here, so they are claimed again now.
            again = {p for p, held in outcome.stale.items() if self.store.offsets.epoch(p) != held}
            for partition in sorted(outcome.stale.keys() - again):
                await self._overtaken(partition, outcome.stale[partition])
            spans = {p: span for p, span in spans.items() if p in again}
            keys = {p: ks for p, ks in keys.items() if p in again}

    async def _hand_to_lanes(
        self, outcome: ClaimOutcome, keys: dict[int, list[OfferedKey]]
    ) -> None:
        self.stats["claimed"] += len(outcome.claimed)
        self.stats["skipped"] += outcome.skipped
        self.stats["fenced"] += outcome.fenced
        self.stats["codeless"] += outcome.codeless
        if outcome.codeless:
            log.warning(
                "%d recipients claimed with no promo code left: released, campaign paused "
                "(promo_pool_empty)",
                outcome.codeless,
            )
        metrics.count_skipped((key[0] for ks in keys.values() for _, key in ks), outcome.skipped)
        if outcome.fenced:
            log.info("%d recipients below the stored offsets: claimed before", outcome.fenced)
        by_partition: dict[int, list[ClaimedRecipient]] = {}
        partition_of = {key: p for p, ks in keys.items() for _, key in ks}
        for row in outcome.claimed:
            by_partition.setdefault(partition_of[(row.campaign_id, row.seq)], []).append(row)
        for partition, rows in by_partition.items():
            self._lost_now(partition)  # claimed under a newer epoch: its lane runs again
            lane = self._lane(partition)
            lane.put(rows)
            if lane.revoked:  # revoked while we were claiming: not ours to send any more
                await lane.revoke()

    async def _overtaken(self, partition: int, held: int | None) -> None:
        """A claim found the partition owned by another worker (a newer epoch): this worker
        lost it, maybe while it was paused, and the group has not told it yet. It stops
        sending the partition: the lane's queued rows are released (reconcile rings for them
        again), the unclaimed records are forgotten, and records that still arrive are
        dropped until the group assigns the partition to this worker again. No error: the
        rebalance catches up."""
        if partition in self._lost and self._lost[partition] == held:
            return
        self._lost[partition] = held
        self.stats["overtaken"] += 1
        log.warning(
            "partition %s: another worker owns it now (epoch %s held here is stale); its lane "
            "stops until the partition is assigned here again",
            partition,
            held,
        )
        self._forget_unclaimed(partition)
        lane = self.lanes.get(partition)
        if lane is not None and not lane.revoked:
            await lane.revoke()

    def _lost_now(self, partition: int) -> bool:
        """Whether the partition is still another worker's: true while this worker holds the
        epoch a claim found stale. A newer epoch (the partition was assigned here again)
        ends that, and the lane, stopped for it, runs again."""
        if partition not in self._lost:
            return False
        if self.store.offsets.epoch(partition) == self._lost[partition]:
            return True
        del self._lost[partition]
        lane = self.lanes.get(partition)
        if lane is not None and lane.revoked:
            lane.assign()
        return False

    async def reassign(self, owned: set[int]) -> None:
        """The partitions this worker owns after a rebalance: lanes of lost partitions stop
        (queued rows released), lanes of new ones start with fresh pacers."""
        for partition in list(self._unclaimed):
            if partition not in owned:
                self._forget_unclaimed(partition)
        for partition in list(self._lost):
            if partition not in owned:
                del self._lost[partition]
        self._sync_flow()  # the assignment may have dropped our pauses
        for partition, lane in self.lanes.items():
            if partition not in owned and not lane.revoked:
                await lane.revoke()
        for partition in owned:
            existing = self.lanes.get(partition)
            if existing is None or existing.revoked:
                self._lane(partition).assign()
            else:
                existing.resume()  # kept through the rebalance: its window is still its own

    async def suspend(self, revoked: set[int], settle_s: float = SETTLE_S) -> None:
        """A rebalance began (`revoked` may move to another worker): no lane of those starts a
        call until the assignment that follows, and calls in flight get up to `settle_s` to be
        answered, so the next owner's first second (which it counts as full) comes after them."""
        lanes = [lane for p, lane in self.lanes.items() if p in revoked]
        for lane in lanes:
            lane.suspend()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(lane.settle() for lane in lanes)), settle_s)

    def _lane(self, partition: int) -> Lane:
        lane = self.lanes.get(partition)
        if lane is None:
            lane = self.lanes[partition] = Lane(partition, self)
        lane.start()
        return lane

    async def _unknown_campaigns(self, keys: Mapping[int, list[OfferedKey]]) -> set[int]:
        ids = {key[0] for ks in keys.values() for _, key in ks}
        missing = {cid for cid in ids if self.campaigns.get(cid) is None}
        if not missing:
            return set()
        existing = await self.store.campaign_statuses(sorted(missing))
        # Finished over an hour ago (out of the cache's window): their doorbells need no lane.
        self._settled.update(cid for cid, status in existing.items() if status in SETTLED)
        return missing - existing.keys()

    def _dead_for_unknown(
        self,
        items: Sequence[Queued],
        keys: dict[int, list[OfferedKey]],
        unknown: set[int],
        dead: list[DeadLetter],
    ) -> tuple[dict[int, list[OfferedKey]], list[DeadLetter]]:
        kept = {p: [k for k in ks if k[1][0] not in unknown] for p, ks in keys.items()}
        for item in items:
            doorbell = item.doorbell
            if doorbell is not None and doorbell["campaign_id"] in unknown:
                dead.append(
                    item.dead_letter("unknown_campaign", f"campaign {doorbell['campaign_id']}")
                )
        return kept, dead

    async def _retry(self, fn: Callable[..., Any], *args: Any) -> Any:
        attempt = 0
        while True:
            try:
                return await fn(*args)
            except (StoreUnavailable, DeadLetterFailed) as exc:
                attempt += 1
                delay = backoff_delay(
                    min(attempt, 10), base=0.1, cap=self.config.store_retry_cap_s, rng=self.rng
                )
                log.warning(
                    "%s failed (attempt %d), retrying in %.2fs: %s",
                    getattr(fn, "__name__", fn),
                    attempt,
                    delay,
                    exc,
                )
                await asyncio.sleep(delay)

    # ---- the lane side --------------------------------------------------------------------

    async def record(
        self, campaign_id: int, results: Sequence[RowResult], attempts: Sequence[int]
    ) -> int:
        """Record `results`, each under the claim it is for (`attempts`, in order): a row
        claimed here more than once (its lease ran out in the lane and it was claimed again)
        has a result only for the claim that made it. Returns how many rows changed: a row
        no longer under that claim keeps what it has."""
        if not results:
            return 0
        recorded: int = await self._retry(self.store.record_results, campaign_id, results, attempts)
        for r in results:
            if r.status in self.stats:
                self.stats[r.status] += 1
        metrics.count_results(campaign_id, results)
        return recorded

    async def record_rows(
        self, campaign_id: int, rows: Sequence[ClaimedRecipient], status: str, reason: str
    ) -> None:
        """One outcome (no message id) for each of `rows`, under each row's own claim."""
        results = [RowResult(r.seq, status, reason, None) for r in rows]
        await self.record(campaign_id, results, [r.attempt for r in rows])

    def row_cost(self, campaign: LiveCampaign) -> Callable[[ClaimedRecipient], int] | None:
        """What one row costs against the campaign's rate limit, when not one unit each: its
        message's segments for an SMS campaign limited in segments (the channel renders the
        body exactly as it sends it), or its publishes for a push campaign (one per device
        endpoint). None for every other campaign: a row costs one."""
        if campaign.rate_unit != "segments" and campaign.channel != "push":
            return None
        channel = self.channels.get(campaign.channel)
        if channel is None:
            return None
        return functools.partial(channel.segments, campaign)

    async def enter_call(
        self, campaign_id: int, rows: list[ClaimedRecipient]
    ) -> list[ClaimedRecipient]:
        """Right before the request: the rows that enter the call. The others were skipped
        (opted out or suppressed while they waited in the lane) or are no longer this
        worker's claim (their lease expired before their call; the row may since have been
        claimed again, here too); neither is sent. Of two claims of one row in `rows` only the
        newer can be current (each claim increments `attempts`): the older one never goes to
        the statement, whose answer names rows by seq."""
        newest: dict[int, ClaimedRecipient] = {}
        for r in rows:
            if r.seq not in newest or r.attempt > newest[r.seq].attempt:
                newest[r.seq] = r
        current = [r for r in rows if newest[r.seq] is r]
        entered, skipped = await self._retry(self.store.enter_call, campaign_id, current)
        if len(entered) == len(rows):
            return rows
        kept = [r for r in current if r.seq in entered]
        self.stats["skipped"] += skipped
        metrics.count_skipped([campaign_id], skipped)
        lost = len(rows) - len(kept) - skipped
        if lost:
            log.warning(
                "campaign %s: %d row(s) no longer claimed here (lease expired before their "
                "call); not sent",
                campaign_id,
                lost,
            )
        return kept

    async def campaign_left_sending(self, campaign_id: int, why: str) -> None:
        """enter_call found the campaign no longer sending before this worker heard of it:
        read the campaigns now, so the lane's next check releases its rows."""
        log.info("%s before a call entered; its rows are released", why)
        with contextlib.suppress(StoreUnavailable):
            await self.campaigns.refresh()
        campaign = self.campaigns.get(campaign_id)
        if campaign is not None and campaign.status == "sending":
            await asyncio.sleep(HALT_RECHECK_S)  # the refresh failed or lags: no busy loop

    async def leave_call(self, campaign_id: int, rows: Sequence[ClaimedRecipient]) -> None:
        await self._retry(self.store.leave_call, campaign_id, rows)

    async def release(
        self, campaign_id: int, rows: Sequence[ClaimedRecipient], status: str
    ) -> None:
        if status == "cancelled":
            results = [RowResult(r.seq, "cancelled", "campaign_cancelled", None) for r in rows]
        else:
            results = [RowResult(r.seq, "pending", f"released:{status}", None) for r in rows]
        await self.record(campaign_id, results, [r.attempt for r in rows])

    async def pause(self, campaign_id: int, reason: str) -> None:
        if await self._retry(self.store.pause_campaign, campaign_id, reason):
            log.warning("campaign %s paused automatically: %s", campaign_id, reason)
        with contextlib.suppress(StoreUnavailable):
            await self.campaigns.refresh()

    async def call_ses(
        self, campaign: Any, rows: list[ClaimedRecipient], not_before: float
    ) -> CallOutcome:
        """Send `rows` (one campaign) in one SES call, or in several when SES refuses the call
        whole for some of its entries (split until they are isolated: streams.rules.call_split).

        A row whose address fails `is_valid_email` (the check the snapshot's users.email_ok
        makes too) never goes into a call: skipped, `invalid_email:<why>`. The lane paces the
        whole of `rows` as one call: the calls of a split accept a subset of them, and a refused
        call accepts nothing. No request leaves before `not_before` (time.monotonic())."""
        channel = self.channels.get(campaign.channel)
        if channel is not None:
            return await channel.send(campaign, rows, not_before)
        outcome = CallOutcome([], [])
        sendable: list[ClaimedRecipient] = []
        for r in rows:
            problem = is_valid_email(r.email)
            if problem is None:
                sendable.append(r)
            else:
                outcome.final.append(RowResult(r.seq, "skipped", f"invalid_email:{problem}", None))
        split = Bisection(sendable)
        answer_times: list[float | None] = []
        while (call := split.next_call()) is not None:
            if split.calls > 1 and not self.campaigns.is_sending(campaign.id):
                # Paused or cancelled while splitting: the lane releases what was not sent.
                outcome.retry += [*call, *split.remaining()]
                outcome.retry_reason = outcome.retry_reason or "split_interrupted"
                break
            try:
                part = await self._send_bulk(campaign, call, not_before)
            except SesCallFailed as exc:
                answer_times.append(exc.answered_at)
                if is_refused_unsent(exc.code, exc.http_status):
                    self.stats["refused_calls"] += 1
                    split.refused(call, _refusal_reason(exc))
                    continue
                part = self._call_failed(exc, call)
            else:
                answer_times.append(part.answered_at)
            outcome.merge(part)
            if not part.answered:
                # Throttled, unanswered or pausing: calling again now would not help.
                outcome.retry += split.remaining()
                break
        outcome.final += [RowResult(r.seq, "failed", why, None) for r, why in split.culprits]
        if answer_times and None not in answer_times:
            outcome.answered_at = max(t for t in answer_times if t is not None)
        if split.culprits:
            log.warning(
                "campaign %s: SES refused %d of %d address(es) of a call; %d calls isolated them",
                campaign.id,
                len(split.culprits),
                len(sendable),
                split.calls,
            )
        return outcome

    async def _send_bulk(
        self, campaign: Any, rows: list[ClaimedRecipient], not_before: float
    ) -> CallOutcome:
        """One SendBulkEmail call for `rows`, leaving no earlier than `not_before`;
        SesCallFailed when SES answered with an error or not at all."""
        entries = [
            BulkEntry(
                to=r.email,
                replacement_data=replacement_data(r),
                headers=self.headers_for(r),
                tags=_entry_tags(r),
            )
            for r in rows
        ]
        template = campaign.template_for(rows[0].variant) if rows else campaign.template
        seqs = [r.seq for r in rows]
        async with self._calls:
            self.stats["calls"] += 1
            loop = asyncio.get_running_loop()
            began = time.monotonic()
            try:
                statuses, answered_at = await loop.run_in_executor(
                    self._executor,
                    lambda: self._timed_send_bulk(
                        CallClock(not_before),
                        from_address=campaign.from_address,
                        template=template,
                        configuration_set=campaign.configuration_set,
                        entries=entries,
                        default_tags={"campaign": str(campaign.id)},
                    ),
                )
            except SesCallFailed as exc:
                elapsed = time.monotonic() - began
                metrics.observe_ses_call("SendBulkEmail", elapsed, exc.code or "error")
                raise
            metrics.observe_ses_call("SendBulkEmail", time.monotonic() - began, "ok")
        if len(statuses) != len(rows):
            # SES answered, but we cannot tell which entry is which: nobody may be resent.
            reason = f"response_length_mismatch:{len(statuses)}/{len(rows)}"
            unknown = [RowResult(r.seq, "unknown", reason, None) for r in rows]
            return CallOutcome(unknown, [], answered_at=answered_at)
        results = map_bulk_response(seqs, [(s.status, s.message_id, s.error) for s in statuses])
        final: list[RowResult] = []
        retry: list[ClaimedRecipient] = []
        throttled = False
        pause_reason: str | None = None
        retry_reason: str | None = None
        by_seq = {r.seq: r for r in rows}
        for res, st in zip(results, statuses, strict=True):
            if res.outcome is Outcome.SENT:
                final.append(RowResult(res.seq, "sent", None, res.message_id))
            elif res.outcome is Outcome.RETRY:
                retry.append(by_seq[res.seq])
                retry_reason = res.reason
                throttled = throttled or is_entry_throttle(st.status)
            elif res.outcome is Outcome.PAUSE_CAMPAIGN or is_campaign_fatal(st.status):
                final.append(RowResult(res.seq, "pending", res.reason, None))
                pause_reason = res.reason
            elif res.outcome is Outcome.UNKNOWN:
                final.append(RowResult(res.seq, "unknown", res.reason, None))
            else:
                final.append(RowResult(res.seq, "failed", res.reason, None))
        return CallOutcome(
            final, retry, retry_reason, throttled, pause_reason, answered_at=answered_at
        )

    def _timed_send_bulk(self, clock: CallClock, **call: Any) -> tuple[list[EntryStatus], float]:
        """`ses.send_bulk` in the executor's thread, with the moment its answer arrived, read
        there before the answer is parsed: parsing and the hop back to a busy event loop can
        take tens of milliseconds, and a lane's window counts every call until a second after
        its answer."""
        try:
            statuses = self.ses.send_bulk(**call, clock=clock)
        except SesCallFailed as exc:
            if exc.http_status is not None:
                exc.answered_at = clock.answered_at or time.monotonic()
            raise
        return statuses, clock.answered_at or time.monotonic()

    def _call_failed(self, exc: SesCallFailed, rows: list[ClaimedRecipient]) -> CallOutcome:
        outcome = classify_call_error(exc.code, exc.http_status, timed_out=exc.timed_out)
        reason = f"{exc.code or 'no_response'}"
        if outcome is Outcome.RETRY:
            return CallOutcome(
                [], rows, reason, throttled=is_throttle(exc.code, exc.http_status), answered=False
            )
        if outcome is Outcome.PAUSE_CAMPAIGN or (exc.code and is_campaign_fatal(exc.code)):
            return CallOutcome(
                [RowResult(r.seq, "pending", reason, None) for r in rows],
                [],
                pause_reason=reason,
                answered=False,
            )
        status = "unknown" if outcome is Outcome.UNKNOWN else "failed"
        return CallOutcome(
            [RowResult(r.seq, status, reason, None) for r in rows], [], answered=False
        )

    async def stop(self, drain_s: float = DRAIN_S) -> None:
        """No more claims; every lane lets its call in flight finish and records it (within
        `drain_s`, all lanes at once), then releases what it still holds."""
        feeders = list(self._feeders.values())
        for task in feeders:
            task.cancel()
        await asyncio.gather(*feeders, return_exceptions=True)
        claimer = self._claimer
        if claimer is not None:
            # A claim cancelled between its commit and the hand-over to the lanes would leave
            # its rows `sending` in no lane until the lease: the round in progress finishes
            # first (the lanes release what it hands them below), within CLAIM_FINISH_S.
            await asyncio.wait({claimer}, timeout=CLAIM_FINISH_S)
            claimer.cancel()
            await asyncio.gather(claimer, return_exceptions=True)
        await asyncio.gather(*(lane.stop(drain_s) for lane in list(self.lanes.values())))
        self._executor.shutdown(wait=False, cancel_futures=True)
        for channel in self.channels.values():
            channel.close()

    def backlog(self) -> int:
        return sum(lane.backlog for lane in self.lanes.values())
