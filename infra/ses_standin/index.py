"""In-memory indexes over accepted messages, rebuilt from the journal at start.

A campaign is the value of the message tag named `campaign` (messages without it form the
campaign ""; tag values cannot be empty, so that key never clashes). Duplicates are counted per
(campaign, lower-cased bare address): a pair accepted k times contributes k - 1.

Promo codes: a bulk entry whose template data holds `promo_code` (flashsend's per-recipient
code) has it journaled with the message; per campaign the index checks that each code reached
one destination and each destination one code (`promo_code_conflicts` counts the messages that
break either; the same code to the same address again is a duplicate, not a conflict).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.ses_standin.stats import bucket_counts, max_in_window, sort_points

MAX_LISTED_DUPLICATES = 100
UNTAGGED = ""
PROMO_VARIABLE = "promo_code"

# One accepted message: (campaign, recipient keys, journal offset, rendering failed).
Accepted = tuple[str, Sequence[str], int, bool]


@dataclass(slots=True)
class Acceptances:
    """Acceptance points, journal offsets and duplicate tracking for one campaign."""

    track_duplicates: bool = True
    times: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    messages: int = 0
    recipients: int = 0
    rendering_failures: int = 0
    seen: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    duplicate_destinations: list[str] = field(default_factory=list)

    def add(self, t: float, keys: Sequence[str], offset: int, rendering_failed: bool) -> None:
        self.add_many(t, [(UNTAGGED, keys, offset, rendering_failed)])

    def add_many(self, t: float, messages: Sequence[Accepted]) -> None:
        """Messages accepted together at `t`, in one step (their campaign is not read)."""
        keys = [key for message in messages for key in message[1]]
        n = len(keys)
        if self.times and self.times[-1] == t:
            self.counts[-1] += n
        else:
            self.times.append(t)
            self.counts.append(n)
        self.offsets.extend([message[2] for message in messages])
        self.messages += len(messages)
        self.recipients += n
        self.rendering_failures += sum(1 for message in messages if message[3])
        if self.track_duplicates:
            self._count_copies(keys)

    def _count_copies(self, keys: Sequence[str]) -> None:
        seen = self.seen
        for key in keys:
            copies = seen.get(key, 0) + 1
            seen[key] = copies
            if copies > 1:
                self.duplicates += 1
                if copies == 2 and len(self.duplicate_destinations) < MAX_LISTED_DUPLICATES:
                    self.duplicate_destinations.append(key)


@dataclass(slots=True)
class PromoTally:
    """Which destination each promo code reached and which code each destination got."""

    destination_of: dict[str, str] = field(default_factory=dict)
    code_of: dict[str, str] = field(default_factory=dict)
    recipients: int = 0  # accepted recipients whose mail carried a code
    conflicts: int = 0
    conflict_list: list[str] = field(default_factory=list)

    def add(self, keys: Sequence[str], code: str) -> None:
        self.recipients += len(keys)
        for key in keys:
            first = self.destination_of.setdefault(code, key)
            held = self.code_of.setdefault(key, code)
            if first != key or held != code:
                self.conflicts += 1
                if len(self.conflict_list) < MAX_LISTED_DUPLICATES:
                    self.conflict_list.append(f"{code} -> {key} (had {first}; held {held})")


class MessageIndex:
    """Per-campaign and per-destination views of the journal."""

    all: Acceptances
    campaigns: dict[str, Acceptances]
    # Journal offsets per recipient key: an int while the address got one message (the usual
    # case), a list from its second on. One-element lists were one object per recipient for
    # the cyclic GC to scan again and again: ~10 % of the send path's CPU at 500k recipients.
    by_destination: dict[str, int | list[int]]
    promo: dict[str, PromoTally]  # per campaign, only those whose mail carried a promo code

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.all = Acceptances(track_duplicates=False)
        self.campaigns = {}
        self.by_destination = {}
        self.promo = {}

    def add_promo(self, campaign: str, keys: Sequence[str], code: str) -> None:
        tally = self.promo.get(campaign)
        if tally is None:
            tally = self.promo[campaign] = PromoTally()
        tally.add(keys, code)

    def add(self, t: float, campaign: str, keys: Sequence[str], offset: int, failed: bool) -> None:
        acceptances = self.campaigns.get(campaign)
        if acceptances is None:
            acceptances = self.campaigns[campaign] = Acceptances()
        acceptances.add(t, keys, offset, failed)
        self.all.add(t, keys, offset, failed)
        _note_destinations(self.by_destination, keys, offset)

    def add_call(self, t: float, messages: Sequence[Accepted]) -> None:
        """One call's messages, all accepted at `t`: the same as `add` for each, in order,
        with each campaign's acceptances updated once per call instead of once per message.
        """
        groups: dict[str, list[Accepted]] = {}
        by_destination = self.by_destination
        for message in messages:
            campaign, keys, offset, _failed = message
            group = groups.get(campaign)
            if group is None:
                groups[campaign] = [message]
            else:
                group.append(message)
            _note_destinations(by_destination, keys, offset)
        for campaign, group in groups.items():
            acceptances = self.campaigns.get(campaign)
            if acceptances is None:
                acceptances = self.campaigns[campaign] = Acceptances()
            acceptances.add_many(t, group)
        if messages:
            self.all.add_many(t, messages)

    def destination_offsets(self, key: str) -> list[int]:
        """Journal offsets of the messages sent to `key`, oldest first."""
        found = self.by_destination.get(key)
        if found is None:
            return []
        return [found] if isinstance(found, int) else found

    def select(self, campaign: str | None) -> Acceptances:
        """The campaign's acceptances (empty if unknown), or all of them for None."""
        if campaign is None:
            return self.all
        return self.campaigns.get(campaign) or Acceptances()

    def stats(self, campaign: str | None) -> dict[str, Any]:
        """The `/_admin/stats` document."""
        acc = self.select(campaign)
        if campaign is None:
            duplicates = sum(c.duplicates for c in self.campaigns.values())
            listed = [d for c in self.campaigns.values() for d in c.duplicate_destinations]
        else:
            duplicates, listed = acc.duplicates, acc.duplicate_destinations
        times, counts = sort_points(acc.times, acc.counts)
        if campaign is None:
            tallies = list(self.promo.values())
        else:
            tallies = [self.promo[campaign]] if campaign in self.promo else []
        return {
            "campaign": campaign,
            "accepted": acc.recipients,
            "messages": acc.messages,
            "duplicates": duplicates,
            "duplicate_destinations": listed[:MAX_LISTED_DUPLICATES],
            "max_1s_window": max_in_window(times, counts, 1.0),
            "first_ts": times[0] if times else None,
            "last_ts": times[-1] if times else None,
            "rendering_failures": acc.rendering_failures,
            "promo_codes": sum(len(t.destination_of) for t in tallies),
            "promo_code_destinations": sum(len(t.code_of) for t in tallies),
            "promo_code_recipients": sum(t.recipients for t in tallies),
            "promo_code_conflicts": sum(t.conflicts for t in tallies),
            "promo_code_conflict_list": [c for t in tallies for c in t.conflict_list][
                :MAX_LISTED_DUPLICATES
            ],
        }

    def rate(self, campaign: str | None, bucket_s: float) -> list[tuple[float, int]]:
        acc = self.select(campaign)
        return bucket_counts(acc.times, acc.counts, bucket_s)


def _note_destinations(
    by_destination: dict[str, int | list[int]], keys: Sequence[str], offset: int
) -> None:
    for key in keys:
        found = by_destination.get(key)
        if found is None:
            by_destination[key] = offset
        elif isinstance(found, int):
            by_destination[key] = [found, offset]
        else:
            found.append(offset)
