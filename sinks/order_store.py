"""The demo order service's database: orders, their outbox, and what it learnt about its mails.

Two integration modes, one code path each (seed: "2 kiến trúc"):
- service (default): `place_order` writes the order and its OrderConfirmed event into the
  outbox in one statement; the relay publishes it; the mail service (own database) mails it.
- monolith: `place_order_monolith` writes the order and calls `enqueue_mail()` on the same
  connection, in the same transaction (needs the `mail` table in the same database).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from flashsend.errors import NotFound
from sinks.mail_enqueue import Enqueued, cancel_mail, enqueue_mail
from sinks.queries import query
from streams.rules.field_domains import epoch_ms_problem, key_problem, text_problem, uuid_problem
from streams.rules.mail_logic import (
    DEFAULT_TEMPLATES,
    CancelResult,
    confirmation_key,
    ms_to_datetime,
)


@dataclass(frozen=True)
class NewOrder:
    email: str
    customer_name: str | None = None
    locale: str = "en"
    total: Decimal = Decimal("0")
    currency: str = "VND"
    items: Sequence[Mapping[str, Any]] = field(default_factory=list)
    send_after_ms: int | None = None  # hold the confirmation until then (delayed mail)
    template: str | None = None


@dataclass(frozen=True)
class Placed:
    order_id: int
    event_id: str | None
    dedupe_key: str


def _order_params(order: NewOrder) -> dict[str, Any]:
    return {
        "email": order.email,
        "customer_name": order.customer_name,
        "locale": order.locale,
        "total": order.total,
        "currency": order.currency,
        "items": Jsonb([dict(i) for i in order.items]),
    }


def place_order(conn: psycopg.Connection[Any], order: NewOrder, *, topic: str) -> Placed:
    """Order + OrderConfirmed in the outbox, one statement. Kafka is not touched here: a dead
    broker cannot fail, slow down or roll back an order (seed traps 1 and 7 of architecture 1)."""
    params = {
        **_order_params(order),
        "topic": topic,
        "send_after_ms": order.send_after_ms,
        "template": order.template,
    }
    row = conn.execute(query("place_order"), params).fetchone()
    assert row is not None
    return Placed(int(row[0]), str(row[1]), str(row[2]))


def cancel_order(
    conn: psycopg.Connection[Any], order_id: int, *, topic: str, reason: str | None = None
) -> str | None:
    """Cancel + OrderCancelled in the outbox, one statement. Returns the event id, or None
    when the order was not confirmed (already cancelled: nothing written).

    The mail outcome is NOT known here (seed cancel trap 6): it arrives later as
    EmailCancelled or EmailCancelTooLate."""
    row = conn.execute(
        query("cancel_order"), {"id": order_id, "topic": topic, "reason": reason}
    ).fetchone()
    return str(row[1]) if row else None


# The monolith demo keeps its orders in flashsend's database, beside the mail rows of the
# service-mode order service: its keys and refs get their own namespace so order 1 of one
# never collides with order 1 of the other.
MONOLITH_PREFIX = "shop"


def monolith_key(order_id: int) -> str:
    return f"{MONOLITH_PREFIX}:{confirmation_key(order_id)}"


def place_order_monolith(conn: psycopg.Connection[Any], order: NewOrder) -> tuple[int, Enqueued]:
    """Monolith: order + mail row in the caller's transaction (wrap in conn.transaction())."""
    row = conn.execute(query("insert_order"), _order_params(order)).fetchone()
    assert row is not None
    order_id = int(row[0])
    data = {
        "order_id": order_id,
        "customer_name": order.customer_name or "",
        "total": str(order.total),
        "currency": order.currency,
        "items": [dict(i) for i in order.items],
        "locale": order.locale,
    }
    send_after = ms_to_datetime(order.send_after_ms) if order.send_after_ms else None
    template = order.template or DEFAULT_TEMPLATES["OrderConfirmed"]
    mail = enqueue_mail(
        conn,
        monolith_key(order_id),
        order.email,
        template,
        data,
        send_after,
        ref=f"{MONOLITH_PREFIX}:{order_id}",
    )
    return order_id, mail


def cancel_order_monolith(
    conn: psycopg.Connection[Any], order_id: int
) -> list[tuple[str, CancelResult]] | None:
    """Monolith: cancel the order and its mails in the SAME transaction (cancel trap 2)."""
    if conn.execute(query("cancel_order_only"), {"id": order_id}).fetchone() is None:
        return None
    return cancel_mail(conn, [monolith_key(order_id)], ref=f"{MONOLITH_PREFIX}:{order_id}")


@dataclass(frozen=True)
class MailEvent:
    event_id: str
    event_type: str
    occurred_at: datetime
    dedupe_key: str
    ref: str | None
    mail_status: str
    message_id: str | None
    reason: str | None

    @classmethod
    def from_record(cls, record: Mapping[str, Any], now_ms: int | None = None) -> MailEvent:
        """Raises ValueError when a field is outside what the order database stores."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        for field_name, problem in (
            ("event_id", uuid_problem(record.get("event_id"))),
            ("", text_problem(record)),
            ("dedupe_key", key_problem(record.get("dedupe_key"))),
            ("occurred_at", epoch_ms_problem(record.get("occurred_at"), now_ms=now_ms)),
        ):
            if problem is not None:
                raise ValueError(f"{field_name}: {problem}" if field_name else problem)
        return cls(
            event_id=str(record["event_id"]),
            event_type=str(record["event_type"]),
            occurred_at=ms_to_datetime(int(record["occurred_at"])),
            dedupe_key=str(record["dedupe_key"]),
            ref=record.get("ref"),
            mail_status=str(record["mail_status"]),
            message_id=record.get("message_id"),
            reason=record.get("reason"),
        )


def apply_mail_event(conn: psycopg.Connection[Any], event: MailEvent) -> bool:
    """Record a lifecycle event; False when it changed nothing (duplicate or older)."""
    ref = event.ref
    if ref is None or not (ref.isascii() and ref.isdigit() and len(ref) <= 18):
        return False  # not a mail of one of our orders (their ids are bigints)
    cancel_outcome = {"EmailCancelled": "cancelled", "EmailCancelTooLate": "too_late"}.get(
        event.event_type
    )
    row = conn.execute(
        query("apply_mail_event"),
        {
            "dedupe_key": event.dedupe_key,
            "order_id": int(ref),
            "status": event.mail_status,
            "occurred_at": event.occurred_at,
            "message_id": event.message_id,
            "reason": event.reason,
            "cancel_outcome": cancel_outcome,
            "sets_status": event.event_type != "EmailCancelTooLate",
            "event_id": event.event_id,
        },
    ).fetchone()
    return row is not None


def order_with_emails(conn: psycopg.Connection[Any], order_id: int) -> dict[str, Any]:
    row = (
        conn.cursor(row_factory=dict_row)
        .execute(query("order_with_emails"), {"id": order_id})
        .fetchone()
    )
    if row is None:
        raise NotFound(f"no order {order_id}")
    if isinstance(row["emails"], str):
        row["emails"] = json.loads(row["emails"])
    return row
