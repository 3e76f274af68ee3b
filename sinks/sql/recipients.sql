-- name: snapshot_recipients
-- One INSERT…SELECT inside the transaction that moves the campaign out of draft (the lock that
-- makes a second start a no-op, so no ON CONFLICT: its speculative insertion cost 2.6 s on
-- 860k rows). seq is dense 1..N in user id order over every row, skipped ones included.
-- One mail per mailbox: of the audience's users sharing a normalised address
-- (users.email_key), the lowest user id with a valid address is pending and the others are
-- skipped, 'duplicate_address' (valid spellings rank first, so an invalid one never takes the
-- mailbox from a valid one). Invalid addresses (users.email_ok, the same check
-- as the sender's streams.rules.addresses.is_valid_email) are skipped, 'invalid_email', so they never
-- reach SES. Both are generated columns of users (migrations 0012, 0015), computed when the user
-- row is written rather than here for every user of every campaign. Ranking duplicates is a
-- second sort of the audience, by address (the first, by id, numbers seq); the address leads
-- the sort key so PostgreSQL can compare abbreviated keys. Its cost is in docs/decisions.md. {audience} is the campaign's configured condition over users u (psycopg
-- sql.format: braces doubled). {partition} is the campaign's own table, not yet attached and
-- without indexes (sinks/recipient_partitions.py): the parent's counter trigger does not see
-- these rows, so count_snapshot records them.
-- A/B test (streams/rules/ab_test.py): with variant_names (and their cumulative variant_bounds
-- in basis points) each user's variant is the first whose bound exceeds the user's bucket,
-- md5("<campaign>:<user>") mod 10,000 (ab_test.assignment_bucket is the twin); a user in no
-- variant is `held` until a winner is set. Without variants (NULL) the CASE never computes
-- the bucket. With a seed hold (streams/rules/seed_list.py) every audience row that would be
-- pending is `held` until the hold ends (release_hold); a scheduled campaign takes no seed hold.
-- A scheduled campaign (streams/rules/send_plan.py) passes a plan: zone_names/zone_at (a local
-- window: the user's zone's send_after, 'infinity' when its window has passed; a zone not in
-- the plan takes entry 1, the default zone) or wave_* (engagement waves: the user's wave's
-- start plus its slot, md5("<campaign>:<user>")'s first 32 bits modulo the wave's slot
-- count; send_plan.wave_send_after is the twin). A row due later than %(now)s is `held`; {order} is "a.send_after, a.id" then, so
-- each slot is a contiguous seq range, else "a.id". Without a plan send_after stays NULL.
INSERT INTO {partition} (campaign_id, seq, user_id, email, status, reason, variant, send_after)
SELECT %(campaign_id)s, row_number() OVER (ORDER BY {order}), a.id, a.email,
       CASE WHEN NOT (a.email_ok AND a.nth = 1) THEN 'skipped'
            WHEN %(hold)s THEN 'held'
            WHEN %(variant_names)s::text[] IS NOT NULL AND a.variant IS NULL THEN 'held'
            WHEN a.send_after = 'infinity' THEN 'skipped'
            WHEN a.send_after > %(now)s::timestamptz THEN 'held'
            ELSE 'pending' END,
       CASE WHEN NOT a.email_ok THEN 'invalid_email'
            WHEN a.nth > 1 THEN 'duplicate_address'
            WHEN a.send_after = 'infinity' THEN 'window_passed' END,
       a.variant,
       CASE WHEN a.send_after < 'infinity' THEN a.send_after END
  FROM (SELECT u.id, u.email, u.email_ok,
               row_number() OVER (PARTITION BY u.email_key ORDER BY u.email_ok DESC, u.id) AS nth,
               CASE WHEN %(variant_names)s::text[] IS NOT NULL THEN
                 (SELECT v.name
                    FROM unnest(%(variant_names)s::text[], %(variant_bounds)s::int[])
                         AS v(name, upper)
                   WHERE ('x' || left(md5(%(campaign_id)s::bigint::text || ':' || u.id::text), 8))
                         ::bit(32)::bigint %% 10000 < v.upper
                   ORDER BY v.upper LIMIT 1)
               END AS variant,
               CASE WHEN %(zone_names)s::text[] IS NOT NULL THEN
                 (%(zone_at)s::timestamptz[])[coalesce(
                     array_position(%(zone_names)s::text[], coalesce(u.timezone, '')), 1)]
                    WHEN %(wave_starts)s::timestamptz[] IS NOT NULL THEN
                 (SELECT (%(wave_starts)s::timestamptz[])[w.n]
                         + (('x' || left(md5(%(campaign_id)s::bigint::text || ':'
                                            || u.id::text), 8))::bit(32)::bigint
                            %% (%(wave_slots)s::int[])[w.n])
                           * (%(wave_widths)s::float8[])[w.n] * interval '1 second'
                    FROM (SELECT CASE WHEN greatest(u.last_open_at, u.last_click_at)
                                           >= %(recent_since)s::timestamptz
                                      THEN %(recent_wave)s::int ELSE %(rest_wave)s::int END
                         ) AS w(n))
               END AS send_after
          FROM users u
         WHERE ({audience})
           AND NOT EXISTS (SELECT 1 FROM email_suppressions s WHERE s.email = u.email_key)) a;

-- name: count_snapshot
-- The counters the insert trigger of migration 0010 would have written for the snapshot's
-- rows (all pending or skipped, none flagged requeue, none sent), and what the snapshot set
-- aside, on the campaign row for `campaign status`; one pass over the new rows. Any shard will
-- do: readers sum them. Runs in the snapshot's transaction, which holds the campaign row.
WITH counted AS MATERIALIZED (
    SELECT status, reason, count(*) AS n FROM {partition} GROUP BY status, reason
), counters AS (
    INSERT INTO campaign_status_counts AS c (campaign_id, shard, status, n)
    SELECT %(campaign_id)s, 0, status, sum(n) FROM counted GROUP BY status ORDER BY status
    ON CONFLICT (campaign_id, shard, status) DO UPDATE SET n = c.n + EXCLUDED.n
)
UPDATE campaigns
   SET duplicate_addresses = (SELECT coalesce(sum(n), 0) FROM counted
                               WHERE reason = 'duplicate_address'),
       invalid_addresses = (SELECT coalesce(sum(n), 0) FROM counted
                             WHERE reason IN ('invalid_email', 'invalid_phone'))
 WHERE id = %(campaign_id)s;

-- name: pending_for_produce
-- Rows still waiting for a doorbell, in seq order (primary-key range scan).
SELECT seq, user_id FROM campaign_recipients
 WHERE campaign_id = %(campaign_id)s AND status = 'pending' AND seq > %(after_seq)s
 ORDER BY seq
 LIMIT %(limit)s;

-- name: claim_batch
-- Re-check opt-in and suppression right before sending (seed trap 6), then claim. The
-- conditional UPDATE (status = 'pending', campaign sending) is the claim: two workers racing
-- on the same rows serialise on the row lock and the second finds nothing to do.
-- A doorbell of a PAUSED campaign is consumed too (the partition keeps flowing for other
-- campaigns): its row stays pending and is flagged `requeue`, so resume re-produces only the
-- rows whose doorbell is gone, not every pending row (returned with status 'pending').
-- `cand` is MATERIALIZED: planned on its own, the five-way join and the update are two small
-- plans instead of one of six relations (planning 0.98 -> 0.49 ms a claim, execution the same;
-- docs/decisions.md). The update's own `r.status = 'pending'` still decides the race.
WITH batch AS (
    SELECT * FROM unnest(%(campaign_ids)s::bigint[], %(seqs)s::int[]) AS b(campaign_id, seq)
), cand AS MATERIALIZED (
    SELECT r.campaign_id, r.seq, u.first_name, c.status = 'paused' AS paused,
           CASE WHEN u.id IS NULL AND r.user_id >= 0 THEN 'user_deleted'  -- a seed: no user
                WHEN NOT u.marketing_opt_in THEN 'opted_out'
                WHEN u.status <> 'active' THEN 'inactive'
                WHEN s.email IS NOT NULL THEN 'suppressed:' || s.reason
           END AS skip_reason
      FROM batch b
      JOIN campaign_recipients r ON r.campaign_id = b.campaign_id AND r.seq = b.seq
                                -- = ANY: the planner drops other campaigns' partitions.
                                -- The distinct ids, not one per key: the cost grew with
                                -- keys x array length (a 1,000-key claim took 186 ms with
                                -- one id per key, 19 ms with the distinct ids; docs/decisions.md).
                                AND r.campaign_id = ANY(%(campaigns)s::bigint[])
      JOIN campaigns c ON c.id = r.campaign_id AND c.status IN ('sending', 'paused')
      LEFT JOIN users u ON u.id = r.user_id
      LEFT JOIN email_suppressions s ON s.email = lower(btrim(r.email))  -- normalised key
     WHERE r.status = 'pending'
)
UPDATE campaign_recipients r
   SET status = CASE WHEN cand.paused THEN 'pending'
                     WHEN cand.skip_reason IS NULL THEN 'sending' ELSE 'skipped' END,
       reason = CASE WHEN cand.paused THEN r.reason ELSE cand.skip_reason END,
       claimed_at = CASE WHEN cand.paused THEN r.claimed_at ELSE now() END,
       requeue = cand.paused,
       attempts = r.attempts
                  + CASE WHEN NOT cand.paused AND cand.skip_reason IS NULL THEN 1 ELSE 0 END
  FROM cand
 WHERE r.campaign_id = cand.campaign_id AND r.seq = cand.seq AND r.status = 'pending'
   AND r.campaign_id = ANY(%(campaigns)s::bigint[])
RETURNING r.campaign_id, r.seq, r.user_id, r.email, cand.first_name, r.status, r.attempts,
          r.variant, r.send_before;

-- name: own_partition
-- Whether the campaign's rows are in a partition of its own that carries the counter trigger
-- for updates naming it (migration 0013), so claim_in_partition and record_results may
-- name it. False for a retired campaign, one in the legacy partition, or a partition of a
-- database that predates the trigger: those go through the parent. A detach in progress
-- counts as gone.
SELECT EXISTS (
    SELECT 1
      FROM pg_inherits i
      JOIN pg_trigger t ON t.tgrelid = i.inhrelid AND t.tgname = %(trigger)s
     WHERE i.inhrelid = to_regclass(%(name)s)
       AND i.inhparent = 'campaign_recipients'::regclass
       AND NOT i.inhdetachpending
);

-- name: claim_in_partition
-- claim_batch for the keys of ONE campaign, addressed to the campaign's own partition (a
-- {partition} of migration 0011 that carries the counter trigger, migration 0013). On the
-- parent, every execution was planned again: a generic plan of a statement on the parent
-- locks all ~150 partitions at each execution, so PostgreSQL kept custom plans, and planning
-- took about a third of the claim's and record_results' server time (pg_stat_statements,
-- docs/decisions.md). On the partition the generic plan is cheap and reused. Same checks,
-- same race rule as claim_batch.
WITH cand AS MATERIALIZED (
    SELECT r.seq, u.first_name, c.status = 'paused' AS paused,
           CASE WHEN u.id IS NULL AND r.user_id >= 0 THEN 'user_deleted'  -- a seed: no user
                WHEN NOT u.marketing_opt_in THEN 'opted_out'
                WHEN u.status <> 'active' THEN 'inactive'
                WHEN s.email IS NOT NULL THEN 'suppressed:' || s.reason
           END AS skip_reason
      FROM unnest(%(seqs)s::int[]) AS b(seq)
      JOIN {partition} r ON r.campaign_id = %(campaign_id)s AND r.seq = b.seq
      JOIN campaigns c ON c.id = %(campaign_id)s AND c.status IN ('sending', 'paused')
      LEFT JOIN users u ON u.id = r.user_id
      LEFT JOIN email_suppressions s ON s.email = lower(btrim(r.email))  -- normalised key
     WHERE r.status = 'pending'
)
UPDATE {partition} r
   SET status = CASE WHEN cand.paused THEN 'pending'
                     WHEN cand.skip_reason IS NULL THEN 'sending' ELSE 'skipped' END,
       reason = CASE WHEN cand.paused THEN r.reason ELSE cand.skip_reason END,
       claimed_at = CASE WHEN cand.paused THEN r.claimed_at ELSE now() END,
       requeue = cand.paused,
       attempts = r.attempts
                  + CASE WHEN NOT cand.paused AND cand.skip_reason IS NULL THEN 1 ELSE 0 END
  FROM cand
 WHERE r.campaign_id = %(campaign_id)s AND r.seq = cand.seq AND r.status = 'pending'
RETURNING r.campaign_id, r.seq, r.user_id, r.email, cand.first_name, r.status, r.attempts,
          r.variant, r.send_before;

-- name: record_results
-- Outcome of one SES call, one statement. Only rows still 'sending' under the caller's claim
-- (its `attempts`) change: reconcile may have declared them unknown meanwhile, or returned a
-- row that never entered a call to pending for another worker to claim, and a late answer or
-- release must not rewrite that. A row going back to pending leaves its call. {partition} is
-- the campaign's own partition when it carries the counter trigger (see claim_in_partition),
-- else campaign_recipients.
UPDATE {partition} r
   SET status = o.status, reason = o.reason, message_id = o.message_id,
       sent_at = CASE WHEN o.status = 'sent' THEN now() ELSE r.sent_at END,
       requeue = (o.status = 'pending'),
       in_call_at = CASE WHEN o.status = 'pending' THEN NULL ELSE r.in_call_at END
  FROM unnest(%(seqs)s::int[], %(statuses)s::text[], %(reasons)s::text[],
              %(message_ids)s::text[], %(attempts)s::int[])
       AS o(seq, status, reason, message_id, attempt)
 WHERE r.campaign_id = %(campaign_id)s AND r.seq = o.seq AND r.status = 'sending'
   AND r.attempts = o.attempt;

-- name: enter_call
-- Right before a call's HTTP request: the rows enter the call (in_call_at), or are skipped if
-- their user opted out, left or was suppressed while the row waited in its lane. Only rows
-- still 'sending' under the caller's claim (`attempts`) enter: a row whose lease expired
-- before its call went back to pending and may be another worker's claim now. Idempotent for
-- the caller (a retried statement, or throttled entries sent again, find the same rows).
-- Entering renews the lease (claimed_at): a row may wait in its lane until its lease has run
-- out (PostgreSQL down, a frozen or slow worker) and still be this claim's until a reconcile
-- reaps it; timed from the claim, a reconcile during the call would turn the rows of a live
-- call unknown and drop its answer. Against expire_leases the row lock decides: expired first,
-- the row is no longer 'sending' and does not enter; entered first, expire_leases re-checks
-- claimed_at on the new version and leaves it.
-- Only while the campaign is 'sending' in this statement's snapshot: a pause, cancel or
-- failure committed before it stops every call that has not entered yet, however late the
-- worker hears of it (NOTIFY, poll). Then nothing changes and the one row returned is
-- (NULL, the campaign's status): the caller releases the rows.
-- {partition} as in record_results.
WITH cand AS MATERIALIZED (
    SELECT r.seq,
           CASE WHEN u.id IS NULL AND r.user_id >= 0 THEN 'user_deleted'  -- a seed: no user
                WHEN NOT u.marketing_opt_in THEN 'opted_out'
                WHEN u.status <> 'active' THEN 'inactive'
                WHEN s.email IS NOT NULL THEN 'suppressed:' || s.reason
           END AS skip_reason
      FROM unnest(%(seqs)s::int[], %(attempts)s::int[]) AS c(seq, attempt)
      JOIN campaigns k ON k.id = %(campaign_id)s AND k.status = 'sending'
      JOIN {partition} r ON r.campaign_id = %(campaign_id)s AND r.seq = c.seq
                        AND r.status = 'sending' AND r.attempts = c.attempt
      LEFT JOIN users u ON u.id = r.user_id
      LEFT JOIN email_suppressions s ON s.email = lower(btrim(r.email))  -- normalised key
), entered AS (
    UPDATE {partition} r
       SET in_call_at = CASE WHEN cand.skip_reason IS NULL THEN coalesce(r.in_call_at, now()) END,
           claimed_at = CASE WHEN cand.skip_reason IS NULL THEN now() ELSE r.claimed_at END,
           status = CASE WHEN cand.skip_reason IS NULL THEN 'sending' ELSE 'skipped' END,
           reason = coalesce(cand.skip_reason, r.reason)
      FROM cand
     WHERE r.campaign_id = %(campaign_id)s AND r.seq = cand.seq AND r.status = 'sending'
    RETURNING r.seq, r.status
)
SELECT seq, status FROM entered
UNION ALL
SELECT NULL, status FROM campaigns WHERE id = %(campaign_id)s AND status <> 'sending';

-- name: leave_call
-- Throttled or transient entries: SES accepted nothing of them, so while they wait out their
-- backoff in the lane they are out of a call again. Were the worker to die now, the lease
-- sends them back to pending (not unknown); enter_call puts them in the next call. Renews the
-- lease: the rows are still this live claim's. Only rows still 'sending' under the caller's
-- claim (`attempts`) change.
UPDATE campaign_recipients r
   SET in_call_at = NULL, claimed_at = now()
  FROM unnest(%(seqs)s::int[], %(attempts)s::int[]) AS c(seq, attempt)
 WHERE r.campaign_id = %(campaign_id)s AND r.seq = c.seq AND r.status = 'sending'
   AND r.attempts = c.attempt AND r.in_call_at IS NOT NULL;

-- name: expire_leases
-- Rows claimed, or last entered into a call (enter_call renews the lease), longer ago than the
-- lease whose outcome never got recorded (worker killed or stuck). A row that entered a call
-- may or may not have been sent: it becomes unknown and is NEVER resent automatically (marketing is at-most-once; seed trap 11). A row that never
-- entered one was not sent: it goes back to pending, flagged for requeue, and the worker that
-- claimed it can no longer send it (enter_call and record_results match its claim's
-- `attempts`, which the next claim increments).
UPDATE campaign_recipients
   SET status = CASE WHEN in_call_at IS NULL THEN 'pending' ELSE 'unknown' END,
       reason = CASE WHEN in_call_at IS NULL THEN 'lease_expired_before_call'
                     ELSE 'lease_expired' END,
       requeue = (in_call_at IS NULL)
 WHERE campaign_id = %(campaign_id)s AND status = 'sending'
   AND claimed_at < now() - make_interval(secs => %(lease_s)s);

-- name: take_requeue
-- Rows released without a send (pause, rebalance, retries exhausted) carry requeue = true.
-- Clearing the flag with RETURNING is the claim: concurrent reconcilers split the rows.
UPDATE campaign_recipients SET requeue = false
 WHERE campaign_id = %(campaign_id)s AND status = 'pending' AND requeue
RETURNING seq, user_id;

-- name: restore_requeue
UPDATE campaign_recipients SET requeue = true
 WHERE campaign_id = %(campaign_id)s AND status = 'pending' AND seq = ANY(%(seqs)s);

-- name: pending_count
-- From the trigger-kept counters (migration 0010), not a scan: reconcile runs every few
-- seconds on every worker.
SELECT coalesce(sum(n) FILTER (WHERE status = 'pending'), 0)::bigint AS pending,
       coalesce(sum(n) FILTER (WHERE status = 'sending'), 0)::bigint AS sending,
       coalesce(sum(n) FILTER (WHERE status = 'requeue'), 0)::bigint AS requeue,
       coalesce(sum(n) FILTER (WHERE status = 'held'), 0)::bigint AS held
  FROM campaign_status_counts WHERE campaign_id = %(campaign_id)s;

-- name: stored_offsets
SELECT partition, next_offset FROM kafka_offsets WHERE group_id = %(group_id)s AND topic = %(topic)s;

-- name: claim_lease_check
-- The turn to run expire_leases on a campaign: one reconciler per `every_s`, whichever worker's
-- tick comes first. The conditional UPDATE is the compare-and-set: two ticks at once serialise
-- on the campaign row and the second finds the timestamp fresh.
UPDATE campaigns SET leases_checked_at = now()
 WHERE id = %(campaign_id)s
   AND (leases_checked_at IS NULL
        OR leases_checked_at < now() - make_interval(secs => %(every_s)s))
RETURNING id;
