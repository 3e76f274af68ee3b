-- Seed list first, then the audience (streams/rules/seed_list.py, sinks/seed_store.py).

-- name: insert_seeds
-- In the snapshot's transaction, into the campaign's own partition before it is attached (as
-- snapshot_recipients): nobody else sees these rows before the commit. Seeds follow the
-- audience in seq (after_seq is the audience's count) and carry user ids -1, -2, … so they
-- never meet a real user's (campaign_id, user_id).
INSERT INTO {partition} (campaign_id, seq, user_id, email, status)
SELECT %(campaign_id)s, %(after_seq)s + o.n, -o.n, o.email, 'pending'
  FROM unnest(%(emails)s::text[]) WITH ORDINALITY AS o(email, n);

-- name: skip_seed_addresses
-- Same transaction, same detached partition: an audience row whose normalised address is a
-- seed's is skipped, so the mailbox gets the mail once, as a seed, first. Rows the snapshot
-- already skipped keep their reason.
UPDATE {partition}
   SET status = 'skipped', reason = 'seed_address'
 WHERE user_id >= 0 AND status IN ('pending', 'held')
   AND lower(btrim(email)) = ANY(%(emails)s::text[]);

-- name: set_hold
-- Same transaction, on the campaign row begin_snapshot locked. hold_until is provisional
-- (from the end of the snapshot) until start_hold sets it once the seeds are produced.
UPDATE campaigns
   SET seed_recipients = %(seeds)s, hold_s = %(hold_s)s,
       hold_until = clock_timestamp() + make_interval(secs => %(hold_s)s)
 WHERE id = %(id)s AND status = 'snapshotting';

-- name: start_hold
-- Right after the start has produced the seeds' doorbells (mark_produced): the hold counts
-- from then, so a start retried after a failed produce still gives the seeds their whole
-- hold. Reconcile releases nothing before produced_at is set. A released hold stays as it is.
UPDATE campaigns SET hold_until = now() + make_interval(secs => hold_s)
 WHERE id = %(id)s AND hold_s IS NOT NULL AND hold_released_at IS NULL;

-- name: hold_state
SELECT id, status, seed_recipients, hold_until, hold_released_at, hold_released_by
  FROM campaigns WHERE id = %(id)s;

-- name: seed_rows
-- A campaign's seeds through the (campaign_id, user_id) unique index: user ids below zero.
SELECT email, status, reason, sent_at FROM campaign_recipients
 WHERE campaign_id = %(id)s AND user_id < 0
 ORDER BY user_id DESC;

-- name: release_hold
-- The end of a seed hold, whoever ends it (a worker's reconcile tick when hold_until has
-- passed, `campaign release`, several at once). The guard `hold_released_at IS NULL` on the
-- campaign row is the claim: a second releaser waits for the first one's row lock, re-checks
-- the guard on the committed row and releases nothing. Only a sending or paused campaign
-- releases (a cancelled one's held rows are cancelled by cancel_pending). Released rows
-- become pending with the requeue flag in the same statement: reconcile's take_requeue
-- produces their doorbells (at once by the caller, else at the next tick; on resume when
-- paused). An A/B test's holdout (variant NULL in a campaign with variants) stays held for
-- its winner (set_winner). The NOTIFY wakes the workers' campaign caches.
WITH freed AS (
    UPDATE campaigns
       SET hold_released_at = now(), hold_released_by = %(by)s, updated_at = now()
     WHERE id = %(id)s AND hold_until IS NOT NULL AND hold_released_at IS NULL
       AND status IN ('sending', 'paused')
    RETURNING id, variants IS NULL AS plain
), released AS (
    UPDATE campaign_recipients r
       SET status = 'pending', requeue = true
      FROM freed
     WHERE r.campaign_id = freed.id AND r.campaign_id = %(id)s AND r.status = 'held'
       AND (freed.plain OR r.variant IS NOT NULL)
    RETURNING r.seq
)
SELECT (SELECT count(*) FROM freed) AS freed, (SELECT count(*) FROM released) AS released,
       (SELECT count(*) FROM (SELECT pg_notify('flashsend_campaigns', id::text) FROM freed) n)
         AS notified;
