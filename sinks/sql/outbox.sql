-- The outbox relay (producers/outbox_relay.py), for any table of the outbox shape: the order
-- service's `outbox` and the mail service's `mail_outbox`. {outbox} is the table name
-- (psycopg sql.Identifier). Only one relay runs per outbox (a session advisory lock), so no row
-- locks are needed, and no transaction is ever held open while waiting for the broker.

-- name: outbox_next_batch
-- Unpublished, not dead, in id order (= commit order for one writer): the partial index scan.
SELECT id, event_id, topic, msg_key, schema_name, event_type, version, dedupe_key, payload,
       occurred_at, attempts
  FROM {outbox}
 WHERE published_at IS NULL AND dead_at IS NULL
 ORDER BY id
 LIMIT %(limit)s;

-- name: outbox_mark_published
-- Right after the broker's ack, one row at a time, autocommit: a crash loses at most the mark
-- of rows already acked, which are then published again with the SAME event_id (deduplicated
-- by the consumer). Never one transaction around a batch (seed architecture-2 trap 8).
UPDATE {outbox} SET published_at = now(), last_error = NULL
 WHERE id = %(id)s AND published_at IS NULL;

-- name: outbox_record_failure
-- A failure that belongs to this message (too large, cannot be encoded): count it; at the
-- limit the row is dead (skipped, alerted) so it cannot block every later event forever.
UPDATE {outbox}
   SET attempts = attempts + 1, last_error = left(%(error)s, 500),
       dead_at = CASE WHEN attempts + 1 >= %(max_failures)s THEN now() END
 WHERE id = %(id)s AND published_at IS NULL
RETURNING attempts, dead_at IS NOT NULL AS dead;

-- name: outbox_record_transient
-- The broker is unreachable or slow: remember why, but do not spend the row's failure budget
-- (a 20-minute broker outage must not kill every queued event).
UPDATE {outbox} SET last_error = left(%(error)s, 500)
 WHERE id = %(id)s AND published_at IS NULL;

-- name: outbox_health
-- Backlog, lag of the oldest unpublished row, dead rows: what to alert on.
SELECT count(*) FILTER (WHERE published_at IS NULL AND dead_at IS NULL) AS backlog,
       extract(epoch FROM now() - min(occurred_at)
               FILTER (WHERE published_at IS NULL AND dead_at IS NULL)) AS lag_s,
       count(*) FILTER (WHERE dead_at IS NOT NULL) AS dead
  FROM {outbox};
