"""The monolith's library calls (architecture 1) and the support queries, synchronous.

    with psycopg.connect(dsn) as conn, conn.transaction():
        order_id = insert_order(conn, ...)
        enqueue_mail(conn, f"order-confirmed:{order_id}", email, "order_confirmation", data)

`enqueue_mail` runs on the CALLER's connection, inside the caller's transaction: the mail row
commits with the business change or rolls back with it (no dual write, no `afterCommit`). The
doorbell is a NOTIFY in the same transaction, delivered only at commit; a sender that was not
listening finds the row on its next sweep (`mail_poll_s`), so a lost doorbell costs latency,
never a mail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from flashsend.errors import NotFound, UsageError
from sinks.mail_store import cancel_outcome, lifecycle_params
from sinks.queries import query
from streams.rules.mail_logic import CancelResult, Delivery


@dataclass(frozen=True)
class Enqueued:
    id: int | None  # None: the dedupe key already existed (nothing inserted)
    dedupe_key: str

    @property
    def created(self) -> bool:
        return self.id is not None


def enqueue_mail(
    conn: psycopg.Connection[Any],
    dedupe_key: str,
    to: str,
    template: str,
    data: Mapping[str, Any],
    send_after: datetime | None = None,
    *,
    ref: str | None = None,
    delivery: Delivery = Delivery.AT_LEAST_ONCE,
) -> Enqueued:
    """Insert one mail row in the caller's transaction; a repeated key inserts nothing.

    Choose `dedupe_key` from the business intent, never a timestamp: 'order-confirmed:42',
    'password-reset:<token id>' (not 'password-reset:user-7', which would block the user's
    second, legitimate reset).
    """
    if not dedupe_key or not to or "@" not in to:
        raise UsageError("enqueue_mail needs a dedupe key and a recipient address")
    cur = conn.execute(
        query("insert_mail"),
        {
            "event_id": None,
            "dedupe_key": dedupe_key,
            "ref": ref,
            "to_email": to,
            "template": template,
            "data": Jsonb(dict(data)),
            "delivery": str(delivery),
            "send_after": send_after,
            "occurred_at": None,
        },
    )
    row = cur.fetchone()
    return Enqueued(int(row[0]) if row else None, dedupe_key)


def cancel_mail(
    conn: psycopg.Connection[Any],
    keys: Sequence[str],
    *,
    ref: str | None = None,
    lifecycle_topic: str = "mail.events",
) -> list[tuple[str, CancelResult]]:
    """Cancel mails by key (and every live mail of `ref`) in the caller's transaction — the
    same one that cancels the order (seed cancel trap 2 of architecture 1). A mail already
    being sent is NOT marked cancelled (it may arrive: trap 1); its retries are stopped."""
    cur = conn.execute(
        query("cancel_mail"), {"keys": list(keys), "ref": ref, "cancel_event_id": None}
    )
    results, events = cancel_outcome(cur.fetchall())
    params = lifecycle_params(lifecycle_topic, events)
    if params is not None:
        conn.execute(query("insert_lifecycle_events"), params)
    return results


def mail_status(conn: psycopg.Connection[Any], dedupe_key: str) -> dict[str, Any]:
    """ "Why didn't I get my mail?": the row, and its resends and siblings of the same ref,
    and the confirmations for the key that arrived too old to act on (`stale_events`). With
    no row but stale events, the answer is those: status `stale`, nothing else known."""
    cur = conn.cursor(row_factory=dict_row)
    row = cur.execute(query("mail_by_key"), {"dedupe_key": dedupe_key}).fetchone()
    stale = cur.execute(query("stale_events_by_key"), {"dedupe_key": dedupe_key}).fetchall()
    if row is None:
        if not stale:
            raise NotFound(f"no mail with dedupe key {dedupe_key!r}")
        return {"dedupe_key": dedupe_key, "status": "stale", "stale_events": stale}
    related = cur.execute(
        query("mail_related"), {"prefix": _resend_pattern(dedupe_key), "ref": row["ref"]}
    ).fetchall()
    row["related"] = [r for r in related if r["dedupe_key"] != dedupe_key]
    row["tombstone"] = row["event_id"] is None and row["to_email"] is None
    row["stale_events"] = stale
    return row


def mail_overview(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """For operators: mail rows by status, and the stale confirmations recorded (last day,
    all within the retention, the latest)."""
    cur = conn.cursor(row_factory=dict_row)
    row = cur.execute(query("mail_overview")).fetchone()
    assert row is not None
    return dict(row)


def resend_mail(conn: psycopg.Connection[Any], dedupe_key: str) -> Enqueued:
    """A safe resend: a new row under '<key>:resend:<n>', never the old row rerun.

    Refused while the original is still pending/sending (it may yet go) and for tombstones
    (nothing to resend). Run it in a transaction: resends of one key are serialised there, so a
    second click while the first resend is still on its way creates nothing."""
    conn.execute(query("lock_resends"), {"dedupe_key": dedupe_key})
    status = mail_status(conn, dedupe_key)
    if status["status"] in ("pending", "sending"):
        raise UsageError(f"{dedupe_key} is still {status['status']}: wait for its outcome")
    if status["to_email"] is None:
        raise UsageError(f"{dedupe_key} is a tombstone (cancelled before it was created)")
    in_flight = [
        r["dedupe_key"]
        for r in status["related"]
        if r["dedupe_key"].startswith(f"{dedupe_key}:resend:")
        and r["status"] in ("pending", "sending")
    ]
    if in_flight:  # a double click: the first resend is still on its way
        return Enqueued(None, in_flight[-1])
    prefix = _resend_pattern(dedupe_key)
    count_row = conn.execute(query("count_resends"), {"prefix": prefix}).fetchone()
    new_key = f"{dedupe_key}:resend:{int(count_row[0] if count_row else 0) + 1}"
    row = conn.execute(
        query("resend_mail"), {"new_key": new_key, "dedupe_key": dedupe_key}
    ).fetchone()
    if row is not None:
        conn.execute("SELECT pg_notify('mail_due', '')")
    return Enqueued(int(row[0]) if row else None, new_key)


def _resend_pattern(dedupe_key: str) -> str:
    escaped = dedupe_key.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"{escaped}:resend:%"
