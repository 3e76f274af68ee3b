-- Transactional mail: one named statement per state transition of a `mail` row.
-- Every transition that ends a mail's life is followed, in the same transaction, by
-- `insert_lifecycle_events` (the mail service's outbox), so no state change goes unreported.

-- name: insert_mail
-- ON CONFLICT DO NOTHING with no target catches both UNIQUE keys: a redelivered event (same
-- event_id), a second event for the same intent or a create arriving after a tombstone (same
-- dedupe_key). Two consumers inserting the same row at once serialise on the unique index: the
-- second waits for the first to commit, then inserts nothing (or inserts, if the first rolled
-- back), so nothing is lost and nothing doubled without any distributed lock. The NOTIFY is
-- delivered only at commit: the doorbell never rings for a rolled-back row.
WITH ins AS (
    INSERT INTO mail (event_id, dedupe_key, ref, to_email, template, data, delivery,
                      send_after, occurred_at)
    VALUES (%(event_id)s, %(dedupe_key)s, %(ref)s, %(to_email)s, %(template)s, %(data)s,
            %(delivery)s, coalesce(%(send_after)s, now()), coalesce(%(occurred_at)s, now()))
    ON CONFLICT DO NOTHING
    RETURNING id
)
SELECT ins.id FROM ins CROSS JOIN LATERAL (SELECT pg_notify('mail_due', '')) AS bell;

-- name: cancel_mail
-- The four cases of a cancel in ONE statement (seed, "Handler OrderCancelled"):
--   pending     -> cancelled (in time)
--   sending     -> cancel_requested (too late for this call; stops every later retry)
--   sent/unknown-> flag only: reported as too late
--   no row yet  -> tombstone: a `cancelled` row under the same dedupe_key, event_id NULL, that
--                  swallows a late create (ON CONFLICT in insert_mail)
-- Targets are the given keys plus every live mail of the same ref (cancel by order, not by one
-- key). `WHERE NOT mail.cancel_requested` makes a redelivered cancel a no-op, so "already
-- cancelled" (0 rows) is never confused with "too late" (RETURNING old.status = 'sent').
-- Safe under concurrency: ON CONFLICT locks the row and works on its latest version, so a
-- sender marking it sent at the same instant is ordered before or after us, never lost.
INSERT INTO mail AS m (dedupe_key, ref, status, cancel_requested, cancel_event_id,
                       cancelled_at, occurred_at)
SELECT t.dedupe_key, %(ref)s, 'cancelled', true, %(cancel_event_id)s, now(), now()
  FROM (SELECT unnest(%(keys)s::text[])
        UNION
        SELECT dedupe_key FROM mail
         WHERE %(ref)s::text IS NOT NULL AND ref = %(ref)s
           AND status IN ('pending', 'sending')) AS t(dedupe_key)
ON CONFLICT (dedupe_key) DO UPDATE
   SET cancel_requested = true,
       cancel_event_id = coalesce(m.cancel_event_id, EXCLUDED.cancel_event_id),
       status = CASE WHEN m.status = 'pending' THEN 'cancelled' ELSE m.status END,
       cancelled_at = CASE WHEN m.status = 'pending' THEN now() ELSE m.cancelled_at END,
       updated_at = now()
 WHERE NOT m.cancel_requested
RETURNING new.id, new.dedupe_key, new.ref, new.status, old.status AS old_status,
          (old.id IS NULL) AS tombstone, new.attempts, new.provider_id;

-- name: record_stale_event
-- A confirmation too old to act on (mail_logic.StaleEvent), in the ingest transaction. ON
-- CONFLICT DO NOTHING on the event id: a redelivery records nothing twice, and two workers
-- inserting the same event serialise on the primary key.
INSERT INTO mail_stale_events (event_id, dedupe_key, ref, event_type, occurred_at, age_s)
VALUES (%(event_id)s, %(dedupe_key)s, %(ref)s, %(event_type)s, %(occurred_at)s, %(age_s)s)
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id;

-- name: stale_events_by_key
-- Read-only (support): the stale events recorded for one dedupe key, newest first.
SELECT event_id, event_type, occurred_at, age_s, recorded_at
  FROM mail_stale_events WHERE dedupe_key = %(dedupe_key)s
 ORDER BY recorded_at DESC LIMIT 20;

-- name: mail_overview
-- Read-only (operators): mail rows by status, and the stale events recorded in the last day
-- and in all (within the retention). A count over `mail` is a sequential scan; it is an
-- operator's command, not a hot path.
SELECT (SELECT coalesce(jsonb_object_agg(status, n), '{}'::jsonb)
          FROM (SELECT status, count(*) AS n FROM mail GROUP BY status) AS s) AS by_status,
       (SELECT count(*) FROM mail_stale_events
         WHERE recorded_at > now() - interval '1 day') AS stale_last_day,
       (SELECT count(*) FROM mail_stale_events) AS stale_total,
       (SELECT max(recorded_at) FROM mail_stale_events) AS last_stale_at;

-- name: claim_due_mail
-- Due rows (send_after passed), not cancel-requested, plus rows whose lease expired for
-- at-least-once templates (the worker died mid-call; at-most-once rows go to `unknown` in
-- expire_mail_leases instead). SKIP LOCKED: concurrent senders take different rows; FOR UPDATE
-- re-checks the condition on the latest version, so a cancel committed meanwhile wins.
-- attempts + 1 is the new fencing token. Committed before SES is called.
-- Suppressions are re-checked here, at the last moment (a bounce or complaint can arrive
-- between the enqueue and the send, e.g. for delayed mail), by the normalised address
-- (streams.rules.addresses.normalise_email = lower(btrim(...)), the key of email_suppressions). Only
-- reasons that say "this mailbox must not get mail at all" block transactional mail: a hard
-- bounce, a complaint, or an operator's manual block. A marketing-only reason such as
-- 'unsubscribe' does not (an order confirmation still goes to someone who opted out of
-- newsletters). Templates in %(exempt)s (legally required mail) are not blocked by a bounce
-- or a complaint, only by a manual block. A blocked row ends in this same statement, with no
-- SES call and no new token: `suppressed` with last_error 'suppressed:<reason>' when nothing
-- can have gone out; `unknown` when an earlier attempt may have delivered it (an expired lease,
-- or a retry after no answer), the same rule as everywhere else. The caller writes its
-- EmailFailed in the same transaction.
WITH due AS (
    SELECT id,
           (SELECT s.reason FROM email_suppressions s
             WHERE s.email = lower(btrim(mail.to_email))
               AND (s.reason = 'manual'
                    OR (s.reason IN ('bounce', 'complaint')
                        AND NOT mail.template = ANY(%(exempt)s::text[])))) AS suppressed
      FROM mail
     WHERE ((status = 'pending' AND send_after <= now())
            OR (status = 'sending' AND locked_until < now() AND delivery = 'at_least_once'))
       AND NOT cancel_requested
     ORDER BY send_after, id
     LIMIT %(limit)s
     FOR UPDATE SKIP LOCKED
)
UPDATE mail m
   SET status = CASE WHEN due.suppressed IS NULL THEN 'sending'
                     WHEN m.status = 'sending' OR starts_with(m.last_error, 'no_answer:')
                          THEN 'unknown'
                     ELSE 'suppressed' END,
       attempts = m.attempts + CASE WHEN due.suppressed IS NULL THEN 1 ELSE 0 END,
       claimed_at = now(), updated_at = now(),
       locked_until = CASE WHEN due.suppressed IS NULL
                           THEN now() + make_interval(secs => %(lease_s)s) END,
       last_error = CASE WHEN due.suppressed IS NULL THEN m.last_error
                         ELSE 'suppressed:' || due.suppressed END
  FROM due
 WHERE m.id = due.id
RETURNING m.id, m.dedupe_key, m.ref, m.event_id, m.attempts, m.send_errors, m.to_email,
          m.template, m.data, m.delivery, m.created_at, m.occurred_at,
          due.suppressed, m.status, m.cancel_requested, m.provider_id;

-- name: mark_mail_invalid_address
-- The claimed row's address cannot be sent to (streams.rules.addresses.is_valid_email): it ends
-- `failed` with last_error 'invalid_address:<why>' and no SES call. Fenced by the token like
-- every outcome; a cancel that arrived meanwhile makes it `cancelled` (nothing went out).
UPDATE mail
   SET status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'failed' END,
       cancelled_at = CASE WHEN cancel_requested THEN now() ELSE cancelled_at END,
       last_error = %(error)s, locked_until = NULL, updated_at = now()
 WHERE id = %(id)s AND attempts = %(token)s AND status = 'sending'
RETURNING id, dedupe_key, ref, status, cancel_requested, attempts, provider_id;

-- name: mark_mail_sent
-- Only the holder of the current token may record the outcome. A late answer for the same
-- attempt also resolves a row the sweeper had declared `unknown` (its lease ran out), because
-- SES did accept it. RETURNING cancel_requested: a cancel that arrived during the call is
-- reported as too late.
UPDATE mail
   SET status = 'sent', provider_id = %(message_id)s, sent_at = now(), locked_until = NULL,
       last_error = NULL, updated_at = now()
 WHERE id = %(id)s AND attempts = %(token)s AND status IN ('sending', 'unknown')
RETURNING id, dedupe_key, ref, status, cancel_requested, attempts, provider_id;

-- name: mark_mail_retry
-- An explicit failure (SES answered, or the connection was refused before sending): back to
-- pending after a backoff, unless a cancel arrived meanwhile — the flag is read here, in the
-- same statement, never from what the worker saw at claim time (seed: "nhánh lỗi đọc cờ").
UPDATE mail
   SET status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'pending' END,
       cancelled_at = CASE WHEN cancel_requested THEN now() ELSE cancelled_at END,
       send_after = %(retry_at)s, send_errors = send_errors + %(count_error)s,
       last_error = %(error)s, locked_until = NULL, updated_at = now()
 WHERE id = %(id)s AND attempts = %(token)s AND status = 'sending'
RETURNING id, dedupe_key, ref, status, cancel_requested, attempts, provider_id;

-- name: mark_mail_failed
-- Permanent failure or retry budget spent; a cancelled-meanwhile row becomes `cancelled`
-- (nothing went out). Fenced by the token like every outcome.
UPDATE mail
   SET status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'failed' END,
       cancelled_at = CASE WHEN cancel_requested THEN now() ELSE cancelled_at END,
       send_errors = send_errors + 1, last_error = %(error)s, locked_until = NULL,
       updated_at = now()
 WHERE id = %(id)s AND attempts = %(token)s AND status = 'sending'
RETURNING id, dedupe_key, ref, status, cancel_requested, attempts, provider_id;

-- name: mark_mail_unknown
-- No answer from SES for an at-most-once template (or a cancel-requested row): SES may have
-- sent it, so it is never resent automatically. Fenced by the token.
UPDATE mail
   SET status = 'unknown', last_error = %(error)s, locked_until = NULL, updated_at = now()
 WHERE id = %(id)s AND attempts = %(token)s AND status = 'sending'
RETURNING id, dedupe_key, ref, status, cancel_requested, attempts, provider_id;

-- name: expire_mail_leases
-- The sweeper: a `sending` row whose lease ran out belongs to a dead or stuck worker. For an
-- at-most-once template (or one a cancel arrived for) it becomes `unknown`: the dead worker
-- may have sent it. At-least-once rows are re-claimed by claim_due_mail instead. Nothing can
-- stay `sending` forever (seed architecture-1 trap 2).
UPDATE mail
   SET status = 'unknown', last_error = 'lease_expired', updated_at = now()
 WHERE status = 'sending' AND locked_until < now()
   AND (delivery = 'at_most_once' OR cancel_requested)
RETURNING id, dedupe_key, ref, status, cancel_requested, attempts, provider_id;

-- name: insert_lifecycle_events
-- Lifecycle events into the mail service's own outbox, in the transaction of the transition
-- that caused them. event_id defaults to uuidv7() at write time.
INSERT INTO mail_outbox (topic, msg_key, schema_name, event_type, dedupe_key, payload)
SELECT %(topic)s, e.msg_key, 'mail_lifecycle', e.event_type, e.dedupe_key, e.payload
  FROM unnest(%(msg_keys)s::text[], %(event_types)s::text[], %(dedupe_keys)s::text[],
              %(payloads)s::jsonb[]) AS e(msg_key, event_type, dedupe_key, payload);

-- name: next_mail_due
-- When the sender should look again (a delayed mail coming due); partial-index scan.
SELECT min(send_after) AS due FROM mail WHERE status = 'pending' AND NOT cancel_requested;

-- name: mail_by_key
SELECT id, event_id, dedupe_key, ref, to_email, template, data, delivery, status,
       cancel_requested, attempts, send_errors, locked_until, send_after, provider_id,
       last_error, occurred_at, created_at, claimed_at, sent_at, cancelled_at, updated_at
  FROM mail WHERE dedupe_key = %(dedupe_key)s;

-- name: mail_related
-- The other mails of the same intent (resends) and of the same ref (order).
SELECT dedupe_key, status, attempts, provider_id, created_at, sent_at
  FROM mail
 WHERE dedupe_key LIKE %(prefix)s OR (%(ref)s::text IS NOT NULL AND ref = %(ref)s)
 ORDER BY id;

-- name: lock_resends
-- Serialises resends of one key (transaction-scoped advisory lock): a second click waits for
-- the first to commit, then sees its resend still on its way and creates nothing.
SELECT pg_advisory_xact_lock(hashtextextended('flashsend-resend:' || %(dedupe_key)s, 0));

-- name: count_resends
SELECT count(*) FROM mail WHERE dedupe_key LIKE %(prefix)s;

-- name: resend_mail
-- Support's "send it again": a NEW row with a new dedupe key (…:resend:N), never the old job
-- rerun. Runs after lock_resends; ON CONFLICT is the backstop if two ever computed one N.
INSERT INTO mail (dedupe_key, ref, to_email, template, data, delivery)
SELECT %(new_key)s, ref, to_email, template, data, delivery
  FROM mail
 WHERE dedupe_key = %(dedupe_key)s AND to_email IS NOT NULL
ON CONFLICT DO NOTHING
RETURNING id, dedupe_key;

-- name: purge_mail
-- Terminal rows older than the retention horizon, a batch at a time (short transactions).
-- The horizon is checked against the topic's retention before this runs (mail_logic), so a
-- dedupe key never disappears while the broker can still replay the event that made it.
DELETE FROM mail
 WHERE id IN (SELECT id FROM mail
               WHERE created_at < %(horizon)s
                 AND status IN ('sent', 'failed', 'unknown', 'cancelled', 'suppressed')
               ORDER BY created_at
               LIMIT %(limit)s);

-- name: purge_mail_outbox
DELETE FROM mail_outbox
 WHERE id IN (SELECT id FROM mail_outbox
               WHERE occurred_at < %(horizon)s
                 AND (published_at IS NOT NULL OR dead_at IS NOT NULL)
               ORDER BY id
               LIMIT %(limit)s);

-- name: purge_mail_stale_events
-- Same horizon as the mail rows; a batch at a time.
DELETE FROM mail_stale_events
 WHERE event_id IN (SELECT event_id FROM mail_stale_events
                     WHERE recorded_at < %(horizon)s
                     ORDER BY recorded_at
                     LIMIT %(limit)s);
