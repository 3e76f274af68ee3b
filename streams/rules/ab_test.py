"""A/B test, then the winner (pure).

A campaign with variants sends each variant's template to its share of the audience first (the
test share); the rest (the holdout) is snapshotted `held` and produced only once a winner is
set, with the winner's template. Nothing waits per user: the holdout is a status of its rows.

- Assignment is deterministic: a user's bucket is the first 32 bits of md5("<campaign>:<user>")
  modulo 10,000 (basis points). Variant i takes the buckets below the sum of the percents of
  variants 1..i; the others are held. The snapshot computes the same bucket in SQL
  (sinks/sql/recipients.sql, snapshot_recipients); `assignment_bucket` is its twin, tested to
  agree on the stored rows.
- The winner is the variant with the highest rate of the chosen metric (unique opens or clicks
  per delivered mail, per sent mail when no Delivery event arrived); a tie goes to the variant
  declared first, so the choice never depends on row order or timing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flashsend.errors import UsageError

BASIS = 10_000  # buckets: a percent is kept to two decimals
DEFAULT_PERCENT = 10.0
DEFAULT_HOLDOUT_WAIT_S = 2 * 3600.0
WINNER_BY = ("clicks", "opens", "manual")
# The SES event type each automatic metric counts (the configuration set must publish it).
METRIC_EVENT = {"clicks": "Click", "opens": "Open"}
# Variant names travel as an SES message tag value: [A-Za-z0-9_-], kept short.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class VariantError(UsageError):
    """A variant or duration given on the command line is not valid."""


@dataclass(frozen=True)
class Variant:
    name: str
    template: str
    percent: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "template": self.template, "percent": self.percent}

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Variant:
        return cls(str(data["name"]), str(data["template"]), float(data["percent"]))


def parse_variant(text: str) -> Variant:
    """`NAME=TEMPLATE[:PERCENT]` (percent of the audience, default 10)."""
    name, eq, rest = text.partition("=")
    if not eq or not rest:
        raise VariantError(
            f"--variant {text!r}: expected NAME=TEMPLATE[:PERCENT], e.g. A=sale_a:10"
        )
    template, colon, percent_text = rest.partition(":")
    if not _NAME.match(name):
        raise VariantError(f"--variant {text!r}: the name must match [A-Za-z0-9_-]{{1,32}}")
    if not template:
        raise VariantError(f"--variant {text!r}: the template is empty")
    percent = DEFAULT_PERCENT
    if colon:
        try:
            percent = float(percent_text.rstrip("%"))
        except ValueError:
            raise VariantError(f"--variant {text!r}: {percent_text!r} is not a percent") from None
    if not 0 < percent <= 100 or round(percent * 100) != percent * 100:
        raise VariantError(
            f"--variant {text!r}: the percent must be in (0, 100], at most two decimals"
        )
    return Variant(name, template, percent)


def check_variants(variants: Sequence[Variant]) -> list[Variant]:
    """At least two variants, distinct names, shares summing to at most 100 %."""
    if len(variants) < 2:
        raise VariantError("an A/B test needs at least two --variant")
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise VariantError(f"variant names must differ: {names}")
    total = sum(round(v.percent * 100) for v in variants)
    if total > BASIS:
        raise VariantError(f"the variants' percents add up to {total / 100:g} %, more than 100 %")
    return list(variants)


def parse_duration(text: str) -> float:
    """Seconds in `90`, `45s`, `5m`, `2h`, `1h30m`, `1.5h`, `1d`; VariantError otherwise."""
    raw = text.strip().lower()
    if not raw:
        raise VariantError("empty duration")
    try:
        seconds = float(raw)
    except ValueError:
        parts = _DURATION.findall(raw)
        if not parts or "".join(n + u for n, u in parts) != raw:
            raise VariantError(
                f"duration {text!r}: use seconds or units s/m/h/d, e.g. 30s, 5m, 2h, 1h30m"
            ) from None
        seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if seconds < 0 or seconds != seconds:
        raise VariantError(f"duration {text!r} must not be negative")
    return seconds


def assignment_bucket(campaign_id: int, user_id: int) -> int:
    """The user's bucket in [0, BASIS) for this campaign (SQL twin in snapshot_recipients)."""
    digest = hashlib.md5(f"{campaign_id}:{user_id}".encode(), usedforsecurity=False).hexdigest()
    return int(digest[:8], 16) % BASIS


def bounds(variants: Sequence[Variant]) -> list[int]:
    """Each variant's exclusive upper bucket: the running sum of the percents in basis points."""
    out: list[int] = []
    total = 0
    for v in variants:
        total += round(v.percent * 100)
        out.append(total)
    return out


def variant_for(campaign_id: int, user_id: int, variants: Sequence[Variant]) -> str | None:
    """The user's variant, or None when the user is in the holdout."""
    bucket = assignment_bucket(campaign_id, user_id)
    for v, upper in zip(variants, bounds(variants), strict=True):
        if bucket < upper:
            return v.name
    return None


@dataclass(frozen=True)
class VariantCounts:
    """One variant's rows (sent) and the unique SES events counted for it."""

    name: str
    sent: int = 0
    delivered: int = 0
    bounced: int = 0
    complained: int = 0
    opened: int = 0
    clicked: int = 0

    def rate(self, winner_by: str) -> float:
        hits = self.clicked if winner_by == "clicks" else self.opened
        base = self.delivered or self.sent
        return hits / base if base else 0.0


def choose_winner(counts: Sequence[VariantCounts], winner_by: str) -> tuple[str, str]:
    """(winner, why) by the metric's rate; on a tie the variant listed first wins."""
    if winner_by not in METRIC_EVENT:
        raise VariantError(f"no automatic winner by {winner_by!r}")
    if not counts:
        raise VariantError("no variants to choose from")
    best = counts[0]
    for c in counts[1:]:
        if c.rate(winner_by) > best.rate(winner_by):
            best = c
    rates = ", ".join(f"{c.name} {c.rate(winner_by):.2%}" for c in counts)
    return best.name, f"auto: {winner_by} rate {rates}"


def winner_due(started_at: datetime | None, wait_s: float, now: datetime) -> bool:
    """The holdout wait counts from the end of the snapshot (the test share starts then)."""
    return started_at is not None and (now - started_at).total_seconds() >= wait_s


def missing_event_type(winner_by: str, event_types: Sequence[str]) -> str | None:
    """Why an automatic winner cannot be chosen with these published event types, or None."""
    needed = METRIC_EVENT.get(winner_by)
    if needed is None or needed in event_types:
        return None
    return (
        f"--winner-by {winner_by} counts SES {needed} events, but the configuration set "
        f"publishes only {', '.join(event_types)}: add {needed} to FLASHSEND_SES_EVENT_TYPES "
        "(and enable open/click tracking on the configuration set), or use --winner-by manual"
    )
