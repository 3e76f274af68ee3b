-- The demo order service (its own database). Every order change writes its event into the
-- outbox in the SAME statement, so the order and its event are committed or lost together.

-- name: place_order
-- Order + OrderConfirmed outbox row in one statement (one transaction). event_id defaults to
-- uuidv7() in the outbox: generated at write time, so republishing reuses it. The NOTIFY wakes
-- the relay at commit (a doorbell only; the relay also polls).
WITH o AS (
    INSERT INTO orders (email, customer_name, locale, total, currency, items)
    VALUES (%(email)s, %(customer_name)s, %(locale)s, %(total)s, %(currency)s, %(items)s)
    RETURNING *
), ev AS (
    INSERT INTO outbox (topic, msg_key, schema_name, event_type, version, dedupe_key, payload)
    SELECT %(topic)s, o.id::text, 'order_event', 'OrderConfirmed', 1,
           'order-confirmed:' || o.id,
           jsonb_build_object('order_id', o.id, 'email', o.email,
                              'customer_name', o.customer_name, 'locale', o.locale,
                              'total', o.total::text, 'currency', o.currency,
                              'items', o.items, 'send_after', %(send_after_ms)s::bigint,
                              'template', %(template)s::text)
      FROM o
    RETURNING event_id, dedupe_key
)
SELECT o.id, ev.event_id, ev.dedupe_key
  FROM o, ev CROSS JOIN LATERAL (SELECT pg_notify('outbox', '')) AS bell;

-- name: cancel_order
-- Conditional: only a confirmed order is cancelled, and only then is OrderCancelled written.
-- A second cancel (double click) changes nothing and writes no event.
WITH o AS (
    UPDATE orders SET status = 'cancelled', cancelled_at = now()
     WHERE id = %(id)s AND status = 'confirmed'
    RETURNING *
), ev AS (
    INSERT INTO outbox (topic, msg_key, schema_name, event_type, version, dedupe_key, payload)
    SELECT %(topic)s, o.id::text, 'order_event', 'OrderCancelled', 1,
           'order-cancelled:' || o.id,
           jsonb_build_object('order_id', o.id, 'email', o.email, 'locale', o.locale,
                              'reason', %(reason)s::text)
      FROM o
    RETURNING event_id
)
SELECT o.id, ev.event_id FROM o, ev CROSS JOIN LATERAL (SELECT pg_notify('outbox', '')) AS bell;

-- name: insert_order
-- Monolith mode: the order alone; the caller then calls enqueue_mail() in the same transaction.
INSERT INTO orders (email, customer_name, locale, total, currency, items)
VALUES (%(email)s, %(customer_name)s, %(locale)s, %(total)s, %(currency)s, %(items)s)
RETURNING id;

-- name: cancel_order_only
-- Monolith mode: the caller cancels the mails in the same transaction (cancel_mail).
UPDATE orders SET status = 'cancelled', cancelled_at = now()
 WHERE id = %(id)s AND status = 'confirmed'
RETURNING id;

-- name: apply_mail_event
-- A lifecycle event from the mail service, applied idempotently and in occurred_at order:
-- the status only moves to a strictly newer event (a redelivery, or EmailFailed arriving
-- after a later EmailSent, changes nothing). The cancel outcome is kept apart, with its own
-- clock, because EmailCancelTooLate does not change what happened to the mail (a row it
-- creates gets status_at -infinity, so the real status event, whenever it comes, still wins).
INSERT INTO order_emails AS e (dedupe_key, order_id, status, status_at, message_id, reason,
                               cancel_outcome, cancel_at, last_event_id)
VALUES (%(dedupe_key)s, %(order_id)s, %(status)s,
        CASE WHEN %(sets_status)s THEN %(occurred_at)s::timestamptz ELSE '-infinity' END,
        %(message_id)s, %(reason)s,
        %(cancel_outcome)s, CASE WHEN %(cancel_outcome)s::text IS NOT NULL
                                 THEN %(occurred_at)s::timestamptz END, %(event_id)s)
ON CONFLICT (dedupe_key) DO UPDATE
   SET status = CASE WHEN %(sets_status)s AND EXCLUDED.status_at > e.status_at
                     THEN EXCLUDED.status ELSE e.status END,
       message_id = CASE WHEN %(sets_status)s AND EXCLUDED.status_at > e.status_at
                         THEN coalesce(EXCLUDED.message_id, e.message_id) ELSE e.message_id END,
       reason = CASE WHEN %(sets_status)s AND EXCLUDED.status_at > e.status_at
                     THEN EXCLUDED.reason ELSE e.reason END,
       status_at = CASE WHEN %(sets_status)s THEN greatest(e.status_at, EXCLUDED.status_at)
                        ELSE e.status_at END,
       cancel_outcome = CASE WHEN EXCLUDED.cancel_outcome IS NOT NULL
                              AND (e.cancel_at IS NULL OR EXCLUDED.cancel_at > e.cancel_at)
                             THEN EXCLUDED.cancel_outcome ELSE e.cancel_outcome END,
       cancel_at = CASE WHEN EXCLUDED.cancel_outcome IS NOT NULL
                         AND (e.cancel_at IS NULL OR EXCLUDED.cancel_at > e.cancel_at)
                        THEN EXCLUDED.cancel_at ELSE e.cancel_at END,
       last_event_id = EXCLUDED.last_event_id, updated_at = now()
 WHERE (%(sets_status)s AND EXCLUDED.status_at > e.status_at)
    OR (EXCLUDED.cancel_outcome IS NOT NULL
        AND (e.cancel_at IS NULL OR EXCLUDED.cancel_at > e.cancel_at))
RETURNING dedupe_key, status, cancel_outcome;

-- name: order_with_emails
SELECT o.id, o.email, o.status, o.created_at, o.cancelled_at,
       coalesce(jsonb_agg(jsonb_build_object('dedupe_key', e.dedupe_key, 'status', e.status,
                                             'cancel_outcome', e.cancel_outcome,
                                             'message_id', e.message_id))
                FILTER (WHERE e.dedupe_key IS NOT NULL), '[]') AS emails
  FROM orders o LEFT JOIN order_emails e ON e.order_id = o.id
 WHERE o.id = %(id)s
 GROUP BY o.id;
