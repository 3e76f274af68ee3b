"""What a replay (offset reset) would do, and whether to refuse it — pure, `now` passed in.

A replay moves a consumer's stored offsets. Rewinding re-delivers the records in between;
our consumers deduplicate (campaign: the claim needs `status = 'pending'`; transactional: the
UNIQUE event_id / dedupe_key), so the plan classifies every record in the range:

- campaign doorbell: each recipient (campaign_id, seq) it rings for is `send` when its row is
  still pending in a campaign that can send, `dedup` when the row is already done (sent,
  failed, skipped, …);
- order event: `send` when it would create a mail row (neither its event_id nor its
  dedupe_key is known), `dedup` when the UNIQUE keys swallow it, `ignored` when it is older
  than the mail service's maximum event age, `cancel` (idempotent), `dead` (poison).

Skipping forward is the opposite danger: the records in between are never processed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

SENDABLE_CAMPAIGN = frozenset({"sending", "paused", "snapshotting"})
FINISHED_CAMPAIGN = frozenset({"done", "cancelled"})


@dataclass(frozen=True)
class Refusal:
    code: str  # live_members | too_old | finished_campaign | lost_mail | nothing_to_do
    message: str
    overridable: bool  # --i-understand lifts it


@dataclass
class PartitionPlan:
    partition: int
    current: int  # the stored next_offset the workers would seek to now
    target: int  # after the reset
    low: int  # first offset still in the log
    high: int  # log end
    records: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # send/dedup/ignored/cancel/dead
    target_timestamp_ms: int | None = None  # of the record at the target offset
    stored: int | None = None  # kafka_offsets.next_offset as read (None: no row yet)

    @property
    def direction(self) -> str:
        if self.target < self.current:
            return "rewind"
        return "skip" if self.target > self.current else "none"

    @property
    def would_send(self) -> int:
        return self.counts.get("send", 0)

    @property
    def deduplicated(self) -> int:
        return self.counts.get("dedup", 0)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            direction=self.direction, would_send=self.would_send, deduplicated=self.deduplicated
        )
        return d


def clamp_target(requested: int, low: int, high: int) -> int:
    """Offsets outside the log: before it means its first record, after it its end."""
    return max(low, min(requested, high))


def replay_range(current: int, target: int) -> tuple[int, int]:
    """[start, end) of the records affected: re-delivered (rewind) or skipped (forward)."""
    return (target, current) if target < current else (current, target)


def classify_campaign(
    keys: Iterable[tuple[int, int]], rows: Mapping[tuple[int, int], tuple[str | None, str | None]]
) -> tuple[dict[str, int], dict[int, str]]:
    """Counts per outcome for doorbells (in order), and the status of each campaign seen.
    A pending row rung twice is sent once: the second ring counts as `dedup`."""
    counts: dict[str, int] = {}
    campaigns: dict[int, str] = {}
    first_ring: set[tuple[int, int]] = set()
    for key in keys:
        row_status, campaign_status = rows.get(key, (None, None))
        campaigns[key[0]] = campaign_status or "missing"
        if row_status is None or campaign_status is None:
            outcome = "dead"  # unknown campaign or row: the sender dead-letters it
        elif (
            row_status == "pending"
            and campaign_status in SENDABLE_CAMPAIGN
            and key not in first_ring
        ):
            outcome = "send"
            first_ring.add(key)
        else:
            outcome = "dedup"
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts, campaigns


def classify_mail(
    events: Iterable[tuple[str, str | None, str | None]],
    known_event_ids: set[str],
    known_keys: set[str],
) -> dict[str, int]:
    """events: (kind, event_id, dedupe_key) with kind create/cancel/ignored/dead, in order.
    A create is `send` unless its event_id or dedupe_key exists, or an earlier create of the
    range took the key first."""
    counts: dict[str, int] = {}
    taken = set(known_keys)
    for kind, event_id, key in events:
        outcome = kind
        if kind == "create":
            if (event_id in known_event_ids) or (key in taken):
                outcome = "dedup"
            else:
                outcome = "send"
                taken.add(str(key))
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def refusals(
    *,
    kind: str,
    live_members: int,
    partitions: list[PartitionPlan],
    campaigns: Mapping[int, str],
    now_ms: int,
    dedupe_retention_s: float,
) -> list[Refusal]:
    """Why this replay must not run (overridable ones need --i-understand)."""
    found: list[Refusal] = []
    if live_members:
        found.append(
            Refusal(
                "live_members",
                f"the consumer group has {live_members} live member(s): stop every worker of the "
                "group first (they would overwrite the reset with their own progress)",
                overridable=False,
            )
        )
    if all(p.direction == "none" for p in partitions):
        found.append(
            Refusal("nothing_to_do", "every partition is already at the target", overridable=False)
        )
    rewinds = [p for p in partitions if p.direction == "rewind"]
    if kind == "mail":
        horizon = now_ms - int(dedupe_retention_s * 1000)
        old = [
            p.partition
            for p in rewinds
            if p.target_timestamp_ms is not None and p.target_timestamp_ms < horizon
        ]
        if old:
            found.append(
                Refusal(
                    "too_old",
                    f"partitions {old}: the target is older than the dedupe-key retention "
                    f"({dedupe_retention_s / 86400:g} days): keys may be purged, mail could be "
                    "sent twice",
                    overridable=True,
                )
            )
        lost = [p.partition for p in partitions if p.direction == "skip" and p.would_send]
        if lost:
            found.append(
                Refusal(
                    "lost_mail",
                    f"partitions {lost}: skipping forward leaves unprocessed events that would "
                    "create mail (it would never be sent)",
                    overridable=True,
                )
            )
    if kind == "campaign" and rewinds:
        finished = sorted(cid for cid, status in campaigns.items() if status in FINISHED_CAMPAIGN)
        if finished:
            found.append(
                Refusal(
                    "finished_campaign",
                    f"the range re-drives campaign(s) {finished}, which are done or cancelled",
                    overridable=True,
                )
            )
    return found


def blocking(found: list[Refusal], i_understand: bool) -> list[Refusal]:
    return [r for r in found if not r.overridable or not i_understand]
