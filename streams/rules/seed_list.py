"""Seed list first, then the audience (pure).

`campaign start ID --seed-list FILE --hold 5m` sends the campaign's mail to a few internal
addresses first and holds the audience for the hold's length, so a person can read the real
mail before the full send opens (a wrong code found in a seed inbox costs nothing).

- A seed is a recipient row of the campaign keyed by a synthetic user id below zero (the
  list's first address is -1, the next -2, …): real user ids are positive, so the claim knows
  a seed has no users row to check (opt-in, status), and the suppression list still applies.
  Seed rows are not audience: status and report count them apart, as `seed`.
- A seed address that is also an audience address keeps its seed row (it gets the mail first,
  once); its audience row is skipped with reason `seed_address`.
- While the hold lasts, the audience's rows are `held`; the hold ends at `hold_until`, the
  hold's length after the start has produced the seeds (checked by every worker's reconcile
  tick and `campaign reconcile`, with `hold_due`), or earlier by `campaign release ID`. One
  guarded statement releases, whoever calls it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from flashsend.errors import UsageError
from streams.rules.addresses import is_valid_email, normalise_email

DEFAULT_HOLD_S = 300.0
# Enough for any team's inboxes and seed-testing services; a list this long is a mistake
# (an audience given as a seed list would skip the hold's purpose).
MAX_SEEDS = 1_000
RELEASED_BY_EXPIRY = "hold expired"


class SeedListError(UsageError):
    """A seed list that cannot be used."""


def parse_seed_list(lines: Iterable[str], source: str = "seed list") -> list[str]:
    """The list's addresses, normalised, in file order, each once. One address a line; blank
    lines and lines starting with `#` are ignored. An invalid address is refused naming its
    line (the sender's own check: SES would refuse it too)."""
    out: list[str] = []
    seen: set[str] = set()
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        address = normalise_email(text)
        problem = is_valid_email(address)
        if problem is not None:
            raise SeedListError(
                f"{source}, line {number}: {text!r} is not a valid address ({problem})"
            )
        if address not in seen:
            seen.add(address)
            out.append(address)
    if not out:
        raise SeedListError(f"{source}: no address in it (one address a line, # for comments)")
    if len(out) > MAX_SEEDS:
        raise SeedListError(f"{source}: {len(out):,} addresses, more than {MAX_SEEDS:,}")
    return out


def seed_user_id(index: int) -> int:
    """The synthetic user id of the list's `index`-th address (0-based): -1, -2, …"""
    return -(index + 1)


@dataclass(frozen=True)
class HoldState:
    """A campaign's seed hold as its row has it."""

    campaign_id: int
    status: str
    seed_recipients: int
    hold_until: datetime | None
    released_at: datetime | None
    released_by: str | None

    @property
    def holding(self) -> bool:
        """The audience still waits (a hold exists and nobody released it)."""
        return self.hold_until is not None and self.released_at is None


def hold_due(state: HoldState, now: datetime) -> bool:
    """The hold has run out and nobody released it yet (only a sending campaign releases by
    expiry: a paused one is released by the first reconcile after its resume)."""
    return (
        state.holding
        and state.status == "sending"
        and state.hold_until is not None
        and now >= state.hold_until
    )
