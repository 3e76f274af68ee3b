"""What every lab command (demo, bench, chaos, feedback e2e) owes the next run: it cancels the
campaigns it started and did not finish, and it reports a run that failed or was interrupted
as a result with an `error` field instead of a traceback alone.

A campaign left `sending` by a failed run keeps its rate booked against the SES account's
MaxSendRate (producers/campaign.py preflight): every later campaign would be refused until
someone cancels it by hand.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import psycopg

from flashsend.errors import UsageError
from flashsend.settings import Settings
from flashsend.unreachable import stack_hint
from sinks.campaign_store import SETTLED, CampaignStore

log = logging.getLogger("flashsend.lab")


def error_text(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (SIGINT/SIGTERM) before the run finished"
    return stack_hint(exc) or f"{type(exc).__name__}: {exc}"


class StartedCampaigns:
    """The campaigns one lab run created, so whatever stops the run can cancel them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.ids: list[int] = []

    def add(self, campaign_id: int) -> int:
        self.ids.append(campaign_id)
        return campaign_id

    def cancel_unsettled(self, reason: str, wait_s: float = 60.0) -> list[int]:
        """Cancel each campaign not yet done/cancelled/failed; returns the ones cancelled.
        PostgreSQL may be down (chaos stops it): keep trying for `wait_s`."""
        cancelled: list[int] = []
        left = list(self.ids)
        deadline = time.monotonic() + wait_s
        while left:
            try:
                with psycopg.connect(
                    self.settings.pg_dsn, autocommit=True, connect_timeout=3
                ) as conn:
                    store = CampaignStore(conn)
                    while left:
                        cid = left[0]
                        if store.status(cid) not in SETTLED:
                            with contextlib.suppress(UsageError):  # settled meanwhile
                                store.transition(cid, "cancelled", reason)
                                cancelled.append(cid)
                        left.pop(0)
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    log.error("could not cancel campaigns %s: %s", left, exc)
                    raise
                time.sleep(1.0)
        return cancelled


def finish_run(
    result: dict[str, Any],
    started: StartedCampaigns,
    failure: BaseException | None,
    log_line: Callable[[str], None],
) -> dict[str, Any]:
    """The common end of a lab run: record the failure, cancel what is left, say so."""
    if failure is not None:
        result["error"] = error_text(failure)
        log_line(f"run failed: {result['error']}")
    try:
        reason = "lab run stopped early" if failure is not None else "lab run finished"
        cancelled = started.cancel_unsettled(reason)
    except psycopg.Error as exc:
        result["error"] = "; ".join(
            filter(None, [result.get("error"), f"campaigns left live: {error_text(exc)}"])
        )
        return result
    if cancelled:
        result["cancelled_on_exit"] = cancelled
        log_line(f"cancelled campaign(s) {cancelled} left unfinished")
    return result


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (e.g. `timeout`) raises KeyboardInterrupt like Ctrl-C does, so the run's
    cleanup runs instead of the process vanishing with its campaigns live."""

    def raise_interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
