"""When each recipient's mail is due: a local-time window or engagement waves (pure).

A scheduled campaign gives each recipient a `send_after` at snapshot. Rows due then are
`pending` and produced at start like any campaign's; the others are `held` and grouped into
slots (one per distinct send_after, a contiguous seq range because the snapshot numbers seq
by (send_after, user id)). The scheduler releases the slots that come due (sinks/sql/
schedule.sql, release_due_slots); nothing waits per user.

- Local window `--local-window 09:00-11:00 [--date D]`: in each recipient's zone, the window's
  start on D, or now when now is inside the window. With --date, a zone whose window has
  already ended on D is skipped (`window_passed`): a mail meant for that morning does not go
  the next day. Without --date, each zone takes its next window: today's if it has not ended,
  else tomorrow's. An unknown zone name counts as the default zone (and is reported).
- Waves `--waves "recent:30m,rest:2d"`: the tiers in order, each starting when the one before
  it ends; `recent` = opened or clicked within the recent-engagement period, `rest` = everyone
  else (it must come last). A wave is cut into slots of equal width (a minute, at most
  MAX_WAVE_SLOTS per wave) and a recipient's slot is a hash of the campaign and user ids
  (ab_test.assignment_bucket's md5, all 32 bits) modulo the wave's slot count: the modulo of
  the id itself would leave slots empty when a tier's ids share a pattern (every fifth user,
  say). `wave_send_after` is the twin of the SQL.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from flashsend.errors import UsageError
from streams.rules.ab_test import VariantError, parse_duration

TIERS = ("recent", "rest")
WAVE_SLOT_S = 60.0  # a wave's slots are a minute wide …
MAX_WAVE_SLOTS = 96  # … or wider, so a two-day wave has 96 slots of 30 minutes
PASSED = "infinity"  # the SQL's send_after of a zone whose window has passed
_CLOCK = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")


class ScheduleError(UsageError):
    """A local window, date, wave plan or time zone given is not valid."""


@dataclass(frozen=True)
class LocalWindow:
    start: time
    end: time
    date: date | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start.strftime("%H:%M"),
            "end": self.end.strftime("%H:%M"),
            "date": self.date.isoformat() if self.date else None,
        }

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> LocalWindow:
        day = data.get("date")
        return parse_window(f"{data['start']}-{data['end']}", day)


@dataclass(frozen=True)
class Wave:
    tier: str
    span_s: float

    @property
    def slots(self) -> int:
        return max(1, min(MAX_WAVE_SLOTS, math.ceil(self.span_s / WAVE_SLOT_S)))

    @property
    def width_s(self) -> float:
        return self.span_s / self.slots


@dataclass(frozen=True)
class Schedule:
    """A campaign's plan as stored on its row (campaigns.schedule): one of the two."""

    window: LocalWindow | None = None
    waves: tuple[Wave, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        if self.window is not None:
            return {"local_window": self.window.to_dict()}
        return {"waves": [{"tier": w.tier, "span_s": w.span_s} for w in self.waves]}

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Schedule:
        if data.get("local_window"):
            return cls(window=LocalWindow.of(data["local_window"]))
        return cls(waves=tuple(Wave(str(w["tier"]), float(w["span_s"])) for w in data["waves"]))


def _clock(text: str, what: str) -> time:
    m = _CLOCK.match(text.strip())
    if not m:
        raise ScheduleError(f"{what} {text!r}: expected HH:MM (24-hour), e.g. 09:00")
    return time(int(m.group(1)), int(m.group(2)))


def parse_window(text: str, day: str | None = None) -> LocalWindow:
    """`HH:MM-HH:MM` (the start before the end, within one day) and an optional YYYY-MM-DD."""
    start_text, dash, end_text = text.partition("-")
    if not dash:
        raise ScheduleError(f"--local-window {text!r}: expected HH:MM-HH:MM, e.g. 09:00-11:00")
    start = _clock(start_text, "--local-window start")
    end = _clock(end_text, "--local-window end")
    if end <= start:
        raise ScheduleError(
            f"--local-window {text!r}: the end must come after the start on the same day"
        )
    return LocalWindow(start, end, parse_date(day) if day else None)


def parse_date(text: str) -> date:
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise ScheduleError(f"--date {text!r}: expected YYYY-MM-DD, e.g. 2026-12-05") from None


def parse_waves(text: str) -> tuple[Wave, ...]:
    """`TIER:DURATION,…` with tiers from TIERS, each once, `rest` last (e.g. recent:30m,rest:2d)."""
    waves: list[Wave] = []
    for part in (p.strip() for p in text.split(",")):
        tier, colon, span = part.partition(":")
        tier = tier.strip()
        if not colon or tier not in TIERS:
            raise ScheduleError(
                f"--waves {text!r}: each wave is TIER:DURATION with TIER one of "
                f"{', '.join(TIERS)}, e.g. recent:30m,rest:2d"
            )
        try:
            span_s = parse_duration(span)
        except VariantError as exc:
            raise ScheduleError(f"--waves {text!r}: {exc}") from None
        waves.append(Wave(tier, span_s))
    tiers = [w.tier for w in waves]
    if len(set(tiers)) != len(tiers):
        raise ScheduleError(f"--waves {text!r}: each tier at most once")
    if tiers[-1] != "rest":
        raise ScheduleError(f"--waves {text!r}: the last wave must be `rest` (everyone else)")
    return tuple(waves)


def load_zone(name: str) -> ZoneInfo:
    """The IANA zone, or ScheduleError (the default zone setting must be valid)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"time zone {name!r} is unknown: use an IANA name such as Asia/Ho_Chi_Minh "
            "(FLASHSEND_DEFAULT_TIMEZONE)"
        ) from None


def zone_or_default(name: str | None, default: ZoneInfo) -> tuple[ZoneInfo, bool]:
    """(the user's zone, True), or (the default, False) when the name is not a known zone;
    no name at all means the default and is not an unknown one."""
    if not name:
        return default, True
    try:
        return ZoneInfo(name), True
    except (ZoneInfoNotFoundError, ValueError, OSError):  # a path, a directory, a NUL …
        return default, False


def window_slot(
    window: LocalWindow, zone: ZoneInfo, now: datetime
) -> tuple[datetime, datetime] | None:
    """(when a recipient in `zone` is due, when that window ends), both UTC: the window's
    start, or `now` inside the window; None when the window of --date has already ended
    (without --date: tomorrow's window)."""
    day = window.date or now.astimezone(zone).date()
    for attempt in (day, day + timedelta(days=1)):
        start = datetime.combine(attempt, window.start, zone)
        end = datetime.combine(attempt, window.end, zone)
        if now < start:
            return start.astimezone(UTC), end.astimezone(UTC)
        if now < end:
            return now.astimezone(UTC), end.astimezone(UTC)
        if window.date is not None:
            return None
    return None  # unreachable: tomorrow's window has not ended


def window_send_after(window: LocalWindow, zone: ZoneInfo, now: datetime) -> datetime | None:
    """When a recipient in `zone` is due (window_slot's first half)."""
    slot = window_slot(window, zone, now)
    return None if slot is None else slot[0]


@dataclass(frozen=True)
class ZonePlan:
    """The snapshot's lookup: zone name → send_after and the end of that window (ISO text,
    or PASSED for both). names[0] is '' (no zone, or a zone that appeared after planning: the
    default)."""

    names: list[str]
    send_after: list[str]
    unknown: dict[str, int] = field(default_factory=dict)
    until: list[str] = field(default_factory=list)


def plan_zones(
    window: LocalWindow,
    zone_counts: Iterable[tuple[str | None, int]],
    default_zone: str,
    now: datetime,
) -> ZonePlan:
    """Each zone present in the audience (with its user count) and its send_after."""
    default = load_zone(default_zone)

    def at(zone: ZoneInfo) -> tuple[str, str]:
        slot = window_slot(window, zone, now)
        return (PASSED, PASSED) if slot is None else (slot[0].isoformat(), slot[1].isoformat())

    first, end = at(default)
    names, send_after, until = [""], [first], [end]
    unknown: dict[str, int] = {}
    for name, count in zone_counts:
        if not name:
            continue
        zone, known = zone_or_default(name, default)
        if not known:
            unknown[name] = unknown.get(name, 0) + int(count)
        names.append(name)
        first, end = at(zone)
        send_after.append(first)
        until.append(end)
    return ZonePlan(names, send_after, unknown, until)


@dataclass(frozen=True)
class WavePlan:
    """The snapshot's parameters for waves: per wave its start, slot count and width; which
    wave the recently engaged and the others are in; the engagement cut-off."""

    starts: list[datetime]
    slots: list[int]
    widths_s: list[float]
    recent_wave: int  # 1-based, as SQL arrays
    rest_wave: int
    recent_since: datetime


def plan_waves(waves: tuple[Wave, ...], now: datetime, recent_days: float) -> WavePlan:
    starts: list[datetime] = []
    at = now
    for w in waves:
        starts.append(at)
        at += timedelta(seconds=w.span_s)
    index = {w.tier: i + 1 for i, w in enumerate(waves)}
    return WavePlan(
        starts,
        [w.slots for w in waves],
        [w.width_s for w in waves],
        index.get("recent", index["rest"]),
        index["rest"],
        now - timedelta(days=recent_days),
    )


def is_recent(
    plan: WavePlan, last_open_at: datetime | None, last_click_at: datetime | None
) -> bool:
    seen = [t for t in (last_open_at, last_click_at) if t is not None]
    return bool(seen) and max(seen) >= plan.recent_since


def slot_hash(campaign_id: int, user_id: int) -> int:
    """The first 32 bits of md5("<campaign>:<user>") (the SQL computes the same)."""
    digest = hashlib.md5(f"{campaign_id}:{user_id}".encode(), usedforsecurity=False).hexdigest()
    return int(digest[:8], 16)


def wave_send_after(plan: WavePlan, campaign_id: int, user_id: int, recent: bool) -> datetime:
    """The SQL's twin (snapshot_recipients): the wave's start plus the user's slot."""
    w = (plan.recent_wave if recent else plan.rest_wave) - 1
    slot = slot_hash(campaign_id, user_id) % plan.slots[w]
    return plan.starts[w] + timedelta(seconds=slot * plan.widths_s[w])


def schedule_from_flags(
    local_window: str | None, date: str | None, waves: str | None
) -> Schedule | None:
    """The plan given by `--local-window [--date]` or `--waves`, or None (send at start)."""
    if local_window and waves:
        raise ScheduleError("--local-window and --waves cannot be combined")
    if date and not local_window:
        raise ScheduleError("--date needs --local-window")
    if local_window:
        return Schedule(window=parse_window(local_window, date))
    if waves:
        return Schedule(waves=parse_waves(waves))
    return None


def sms_schedule(send_hours: str, requested: Schedule | None) -> Schedule | None:
    """An SMS campaign's plan: promotional texts go only within `send_hours` of the
    recipient's local day (FLASHSEND_SMS_SEND_HOURS; empty: no quiet hours). Without a plan
    of its own the campaign takes the send hours as its local window; a --local-window must
    lie within them. The window's end is the rows' deadline (send_before)."""
    if requested is not None and requested.waves:
        raise ScheduleError("--waves is not available for SMS campaigns (use --local-window)")
    if not send_hours.strip():
        return requested
    try:
        hours = parse_window(send_hours)
    except ScheduleError as exc:
        raise ScheduleError(f"FLASHSEND_SMS_SEND_HOURS: {exc}") from None
    if requested is None or requested.window is None:
        return Schedule(window=hours)
    w = requested.window
    if w.start < hours.start or w.end > hours.end:
        raise ScheduleError(
            f"--local-window {w.start:%H:%M}-{w.end:%H:%M} reaches into the recipients' quiet "
            f"hours: SMS campaigns send only within {hours.start:%H:%M}-{hours.end:%H:%M} local "
            "time (FLASHSEND_SMS_SEND_HOURS)"
        )
    return requested


# The last local clock on Earth: UTC-12 (Baker Island); the first is UTC+14.
LATEST_OFFSET = timedelta(hours=12)


def check_schedule(schedule: Schedule, *, has_variants: bool, now: datetime) -> None:
    """Refuse a plan that cannot be meant: both kinds, an A/B test, or a --date whose window
    has already ended in every zone (everyone would be skipped)."""
    w = schedule.window
    if w is not None and w.date is not None:
        last_end = datetime.combine(w.date, w.end, UTC) + LATEST_OFFSET
        if now >= last_end:
            raise ScheduleError(
                f"--date {w.date.isoformat()}: the window {w.start:%H:%M}-{w.end:%H:%M} has "
                "already ended in every time zone"
            )
    if schedule.window is not None and schedule.waves:
        raise ScheduleError("--local-window and --waves cannot be combined")
    if has_variants:
        raise ScheduleError(
            "an A/B test cannot be scheduled yet: its holdout and the scheduled rows would "
            "share the `held` status (use --variant, or --local-window/--waves, not both)"
        )
