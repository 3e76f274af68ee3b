"""Correction campaigns: `campaign create --correction-of N` makes a campaign whose audience is
exactly the users campaign N sent to (their rows' status `sent`), e.g. to send the right code
after a wrong one went out.

- The audience is a condition over users, like any campaign's: the users of N's `sent` rows,
  AND the campaign's usual condition (default: active and opted in). So failed, skipped,
  unknown, cancelled, held or still pending rows of N are not in it, nor are N's seed rows
  (they are no users; start the correction with `--seed-list` to reach them again).
- Everything else is a normal campaign: the snapshot takes it at start (dedupe of shared
  addresses included), suppressions and opt-outs since N still apply at the claim, and the
  mail goes to each user's address as it is now.
- N must have sent before the correction is created, and must not be sending when the
  correction starts (pause or cancel it first): its sent set would still grow after the
  snapshot.
"""

from __future__ import annotations

from typing import Any

import psycopg

from flashsend.errors import UsageError
from sinks.queries import query


def correction_audience(source_id: int, base: str) -> str:
    """The audience condition of a correction of campaign `source_id` (an int: it is SQL)."""
    source = int(source_id)
    return (
        "u.id IN (SELECT r.user_id FROM campaign_recipients r "
        f"WHERE r.campaign_id = {source} AND r.status = 'sent') AND ({base})"
    )


def check_source_at_create(conn: psycopg.Connection[Any], source_id: int) -> None:
    row = conn.execute(query("correction_source"), {"id": source_id}).fetchone()
    if row is None:
        raise UsageError(f"--correction-of {source_id}: no such campaign")
    if row[1] in ("draft", "snapshotting"):
        raise UsageError(
            f"--correction-of {source_id}: campaign {source_id} is {row[1]}, it has sent nothing"
        )


def check_correction_source(conn: psycopg.Connection[Any], campaign_id: int) -> None:
    """Right before a correction's snapshot: its source must not be sending any more."""
    row = conn.execute(query("correction_of"), {"id": campaign_id}).fetchone()
    if row is None or row[0] is None:
        return
    source = int(row[0])
    status_row = conn.execute(query("correction_source"), {"id": source}).fetchone()
    if status_row is not None and status_row[1] == "sending":
        raise UsageError(
            f"campaign {campaign_id} corrects campaign {source}, which is still sending: its "
            f"sent set grows after the snapshot. Pause it first (flashsend campaign pause "
            f"{source}), or cancel it, then start {campaign_id} again"
        )


def set_correction_of(conn: psycopg.Connection[Any], campaign_id: int, source_id: int) -> None:
    if (
        conn.execute(
            query("set_correction_of"), {"id": campaign_id, "source": source_id}
        ).fetchone()
        is None
    ):
        raise UsageError(f"campaign {campaign_id} is not a draft")
