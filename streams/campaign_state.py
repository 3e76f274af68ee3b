"""What every worker knows about live campaigns, refreshed several times a second.

Pause/cancel are a column (docs/architecture.md §4). Each worker polls the tiny `campaigns`
table every `interval` seconds and lanes consult the cached copy right before each SES call,
so a pause is seen within one interval; `flashsend campaign pause` waits that long before returning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import psycopg

from sinks.recipient_store import LiveCampaign, RecipientStore, StoreUnavailable
from streams.rules.feedback_lag import REPORT_FRESH_S, FeedbackGate
from streams.rules.ramp import RampStep, effective_rate, ramp_from_rows, sending_elapsed

log = logging.getLogger("flashsend.campaigns")

# LISTEN/NOTIFY brings control commands in milliseconds; the poll is the fallback. Each poll
# is a query from every worker, so not faster than needed (0.1 s cost ~5% of a worker's CPU).
POLL_INTERVAL_S = 0.25


class CampaignCache:
    def __init__(
        self,
        store: RecipientStore,
        interval: float = POLL_INTERVAL_S,
        *,
        max_feedback_lag_s: float = 0.0,
    ) -> None:
        self._store = store
        self._interval = interval
        # Closed while the feedback agent is too far behind: lanes start no call.
        self.feedback = FeedbackGate(max_feedback_lag_s)
        self._campaigns: dict[int, LiveCampaign] = {}
        self._ramps: dict[int, tuple[RampStep, ...]] = {}
        self._asked_at = 0.0  # when the last refresh's query was sent (monotonic)
        self.refreshed_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    def sendable_since(self, campaign_id: int) -> float | None:
        """When the campaign's snapshot made its rows sendable (monotonic; never later than
        that instant), None before it or if unknown."""
        c = self._campaigns.get(campaign_id)
        if c is None or c.sending_began_s_ago is None:
            return None
        # Against the instant the query was sent: the database read its clock after it.
        return self._asked_at - c.sending_began_s_ago

    def get(self, campaign_id: int) -> LiveCampaign | None:
        """The campaign if it is live (sending, paused, snapshotting), else None."""
        return self._campaigns.get(campaign_id)

    def is_sending(self, campaign_id: int) -> bool:
        c = self._campaigns.get(campaign_id)
        return c is not None and c.status == "sending"

    def live(self) -> list[LiveCampaign]:
        return list(self._campaigns.values())

    def rate_now(self, campaign: LiveCampaign, now: float | None = None) -> float:
        """The campaign's rate limit at `now` (monotonic): its ramp's step, if it has one, as
        of the sending time read at the last refresh plus the time since (while sending)."""
        if campaign.id not in self._ramps:
            return campaign.rate_limit
        return self.rate_at(campaign, self.sending_clock(campaign, now))

    def sending_clock(self, campaign: LiveCampaign, now: float | None = None) -> float:
        """Seconds the campaign has spent sending at `now` (monotonic), paused time left out:
        read from PostgreSQL at the last refresh, plus the time since while it sends. Every
        worker reads the same clock, which is what the ramp and the share plan run on."""
        at = time.monotonic() if now is None else now
        current = self._campaigns.get(campaign.id, campaign)  # read at `refreshed_at`
        return sending_elapsed(
            current.sending_elapsed_s, self.refreshed_at, at, current.status == "sending"
        )

    def rate_at(self, campaign: LiveCampaign, clock: float) -> float:
        """The campaign's rate limit at `clock` seconds of sending (its ramp's step there)."""
        return effective_rate(campaign.rate_limit, self._ramps.get(campaign.id, ()), clock)

    async def refresh(self) -> None:
        asked = time.monotonic()
        campaigns = await self._store.live_campaigns()
        if self.feedback.max_lag_s > 0:
            # Nothing to hold while nothing sends: the lag is read only then.
            sending = any(c.status == "sending" for c in campaigns)
            lag = await self._store.feedback_lag(REPORT_FRESH_S) if sending else None
            self._update_feedback(lag)
        self._ramps = {c.id: ramp_from_rows(c.ramp) for c in campaigns if c.ramp}
        self._campaigns = {c.id: c for c in campaigns}
        self._asked_at = asked
        self.refreshed_at = time.monotonic()

    def _update_feedback(self, lag_s: float | None) -> None:
        gate = self.feedback
        was = gate.closed
        if gate.update(lag_s) and not was:
            log.warning(
                "the feedback agent is %.1f s behind: campaign calls wait until it is within "
                "%.1f s (feedback_max_lag_s %.1f)",
                lag_s,
                gate.max_lag_s / 2,
                gate.max_lag_s,
            )
        elif was and not gate.closed:
            if lag_s is None:
                log.warning("no fresh report from the feedback agent: campaign calls go on")
            else:
                log.warning("the feedback agent is %.1f s behind now: campaign calls go on", lag_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="campaign-cache")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        wake = asyncio.Event()
        listener = asyncio.create_task(self._listen(wake), name="campaign-listen")
        try:
            while True:
                try:
                    await self.refresh()
                except StoreUnavailable as exc:
                    # Stale for now; lanes treat a stale cache as "not sending" (see is_fresh).
                    log.warning("campaign poll failed: %s", exc)
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self._interval)
        finally:
            listener.cancel()

    async def _listen(self, wake: asyncio.Event) -> None:
        """LISTEN for control commands so a pause is seen in milliseconds, not at the next
        poll. Polling stays as the fallback (a NOTIFY is lost while disconnected)."""
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._store.dsn, autocommit=True
                ) as conn:
                    await conn.execute("LISTEN flashsend_campaigns")
                    async for _ in conn.notifies():
                        wake.set()
            except psycopg.Error as exc:
                log.debug("campaign LISTEN connection lost: %s", exc)
            await asyncio.sleep(1.0)

    def is_fresh(self, max_age: float = 2.0) -> bool:
        """A cache older than max_age cannot prove a campaign is still sending."""
        return time.monotonic() - self.refreshed_at < max_age
