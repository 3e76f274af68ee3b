"""The SES account's 24-hour quota at campaign start: a pure verdict from numbers, and a thin
reader of SESv2 GetAccount's SendQuota.

SES counts Max24HourSend over a rolling 24 hours in recipients; SentLast24Hours is what the
account already used. What a start must fit into is the rest, minus what the other live
campaigns still hold (their rows not yet sent will use the same quota within the day). A
campaign that does not fit is refused before anything is sent: running into
ACCOUNT_DAILY_QUOTA_EXCEEDED halfway pauses it with the audience half served.

`--spread-over-quota` plans a campaign that does not fit across days instead (`QuotaPlan`):
today's remaining quota a day, each day one slot of the scheduler (producers.send_schedule).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from flashsend.errors import FlashsendError
from sinks.queries import query
from sinks.ses import SesSender


class QuotaExceeded(FlashsendError):
    """The campaign does not fit the 24-hour SES quota."""


@dataclass(frozen=True)
class DailyQuota:
    """SendQuota's 24-hour figures; max_24h <= 0 means unlimited (SES reports -1)."""

    max_24h: float
    sent_24h: float

    @property
    def unlimited(self) -> bool:
        return self.max_24h <= 0

    @classmethod
    def from_send_quota(cls, quota: Mapping[str, float]) -> DailyQuota:
        return cls(
            max_24h=float(quota.get("Max24HourSend", -1.0)),
            sent_24h=float(quota.get("SentLast24Hours", 0.0)),
        )


@dataclass(frozen=True)
class QuotaVerdict:
    needed: int  # this campaign's recipients still to send
    held_by_others: int  # other live campaigns' recipients still to send
    quota: DailyQuota

    @property
    def remaining(self) -> float:
        """What is left of the 24-hour quota for this campaign (inf when unlimited)."""
        if self.quota.unlimited:
            return float("inf")
        return max(0.0, self.quota.max_24h - self.quota.sent_24h - self.held_by_others)

    @property
    def fits(self) -> bool:
        return self.needed <= self.remaining

    def refusal(self) -> str:
        """One line with every figure and the ways forward."""
        q = self.quota
        others = (
            f" - {self.held_by_others:,} still to send by other live campaigns"
            if self.held_by_others
            else ""
        )
        return (
            f"the 24-hour SES quota does not fit this campaign: it needs {self.needed:,} "
            f"recipients; remaining {self.remaining:,.0f} = Max24HourSend {q.max_24h:,.0f} - "
            f"SentLast24Hours {q.sent_24h:,.0f}{others}. Narrow the audience (--audience), "
            "start later (the quota is a rolling 24 hours), or start with --ignore-quota "
            "(the campaign then pauses at ACCOUNT_DAILY_QUOTA_EXCEEDED when the quota runs out)"
        )


def verdict(needed: int, held_by_others: int, quota: DailyQuota) -> QuotaVerdict:
    if needed < 0 or held_by_others < 0:
        raise ValueError(f"recipient counts must be >= 0, got {needed}, {held_by_others}")
    return QuotaVerdict(needed, held_by_others, quota)


def read_daily_quota(ses: SesSender) -> DailyQuota:
    """GetAccount's SendQuota; raises SesCallFailed like every SES call."""
    return DailyQuota.from_send_quota(ses.get_send_quota())


@dataclass(frozen=True)
class QuotaPlan:
    """A campaign spread over days of the 24-hour quota (`campaign start --spread-over-quota`).

    Each day sends at most `per_day` recipients: what the quota has left now. The account's
    other traffic of the last 24 hours (and what other live campaigns still hold) is assumed
    to recur every day, so no day counts on a quota that other mail may take. SES counts a
    rolling 24 hours, so a day starts only once the day before has left the window: 24 hours
    after that day's start plus the time its sends take at the campaign's rate, plus a margin.
    """

    needed: int
    per_day: int
    period_s: float

    @property
    def days(self) -> int:
        return max(1, math.ceil(self.needed / self.per_day))

    def counts(self) -> list[int]:
        """Recipients per day, in order."""
        full, last = divmod(self.needed, self.per_day)
        return [self.per_day] * full + ([last] if last else [])

    def to_dict(self) -> dict[str, Any]:
        return {
            "needed": self.needed,
            "per_day": self.per_day,
            "days": self.days,
            "period_s": self.period_s,
        }


DAY_S = 86_400.0
SPREAD_MARGIN_S = 60.0  # beyond a day's last send, before the next day begins


def spread_plan(result: QuotaVerdict, rate: float) -> QuotaPlan:
    """Days for a campaign that does not fit today (pure); QuotaExceeded when nothing is left
    today, so no day could send anything."""
    per_day = math.floor(result.remaining)
    if per_day < 1:
        raise QuotaExceeded(
            result.refusal().split(". ")[0]
            + ": nothing is left of today's quota, so no plan over days can start; "
            "start later (the quota is a rolling 24 hours)"
        )
    send_s = math.ceil(per_day / rate) if rate > 0 else 0.0
    return QuotaPlan(result.needed, per_day, DAY_S + send_s + SPREAD_MARGIN_S)


def check_snapshot(
    conn: psycopg.Connection[Any],
    campaign_id: int,
    quota: DailyQuota,
    *,
    spread: SpreadTarget | None = None,
) -> QuotaPlan | None:
    """Run in the snapshot's transaction once its rows are counted: raises QuotaExceeded
    (which rolls the snapshot back, leaving the campaign a draft) when they do not fit, or,
    with `spread`, holds the rows beyond today's quota in one slot a day and returns the plan.

    What the campaign needs is the snapshot's own count of rows to send (pending, and an A/B
    test's held holdout): the audience after duplicate and invalid addresses are set aside,
    so nobody is counted who will not get the mail (suppressed addresses are still counted:
    they are skipped at claim time, which errs on the safe side)."""
    if quota.unlimited:
        return None
    counts = conn.execute(query("pending_count"), {"campaign_id": campaign_id}).fetchone()
    needed = int(counts[0]) + int(counts[3]) if counts else 0
    conn.execute(query("lock_quota"))
    row = conn.execute(query("quota_held_by_others"), {"id": campaign_id}).fetchone()
    result = verdict(needed, int(row[0]) if row else 0, quota)
    if result.fits:
        return None
    if spread is None:
        raise QuotaExceeded(result.refusal())
    plan = spread_plan(result, spread.rate)
    stmt = sql.SQL(query("spread_over_quota")).format(partition=spread.partition)
    conn.execute(
        stmt,
        {
            "campaign_id": campaign_id,
            "per_day": plan.per_day,
            "period_s": plan.period_s,
            "now": spread.now,
        },
    )
    return plan


@dataclass(frozen=True)
class SpreadTarget:
    """Where and from when `check_snapshot` spreads a campaign: its detached partition (in
    the snapshot's transaction), the start's clock and the campaign's rate."""

    partition: sql.Identifier
    now: datetime
    rate: float
