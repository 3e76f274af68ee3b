-- Promo code pools (migration 0021): one code per recipient, bound in the claim's transaction.
--
-- Why binding is safe under concurrency (claims of different partitions run in parallel in
-- several workers, each in its own transaction):
-- * A code is bound only to rows the SAME transaction has just claimed (claim_in_partition /
--   claim_batch moved them pending -> sending, so it holds their row locks until commit). No
--   other transaction can bind a code to those recipients meanwhile: it would have to claim
--   them first, and its claim waits on the row lock, then finds them no longer pending. A
--   claim rolled back (offset fence, lost epoch, PostgreSQL down) takes its bindings with it.
-- * A recipient that already holds a code (bound by an earlier committed claim: a row put back
--   to pending by a drain, a lease expired before its call, a resend of an unknown row, a
--   resume) keeps it: bind_promo_codes reads the committed binding first and binds a new code
--   only to recipients without one. The unique index promo_codes_recipient backs this.
-- * Free codes are taken FOR UPDATE SKIP LOCKED, each claim starting at a random slot: two
--   claims never wait on each other's codes (no hot row), and a code locked by one is skipped
--   by the other. A code whose binding
--   committed since the scan started fails the re-check `seq IS NULL` and is passed over too.
--   The primary key (campaign_id, code) makes a code exist once per pool, so it is bound once.
-- * Codes are not pre-assigned per Kafka partition: a partition could run dry while others
--   still hold codes, and a rebalance would move ranges around. One pool per campaign, one
--   partial index over its free codes.

-- name: promo_campaign
-- Whether the claim binds codes for this campaign. promo_pool never changes once the campaign
-- has left draft (add_promo_codes refuses), so the store caches it from then on.
SELECT promo_pool, status FROM campaigns WHERE id = %(campaign_id)s;

-- name: lock_promo_campaign
-- Import and generate hold the campaign row for their transaction: a racing `campaign start`
-- (begin_snapshot updates this row) waits, or has already moved the campaign out of draft and
-- the pool is refused, so a started campaign never gains a pool the workers did not see.
SELECT status, promo_pool FROM campaigns WHERE id = %(campaign_id)s FOR UPDATE;

-- name: add_promo_codes
-- New codes into the pool, in the transaction that holds the campaign row
-- (lock_promo_campaign). A code already in the pool is not inserted: the caller compares the
-- count and rolls the whole import back. Marks the campaign as having a pool.
WITH added AS (
    INSERT INTO promo_codes (campaign_id, code)
    SELECT %(campaign_id)s, c.code FROM unnest(%(codes)s::text[]) AS c(code)
    ON CONFLICT (campaign_id, code) DO NOTHING
    RETURNING code
), flagged AS (
    UPDATE campaigns SET promo_pool = true, updated_at = now()
     WHERE id = %(campaign_id)s AND NOT promo_pool
)
SELECT count(*) FROM added;

-- name: promo_codes_present
-- Which of these codes the pool already holds (the error message of a refused import).
SELECT code FROM promo_codes
 WHERE campaign_id = %(campaign_id)s AND code = ANY(%(codes)s::text[])
 ORDER BY code LIMIT %(limit)s;

-- name: bind_promo_codes
-- One code for each of %(seqs)s, recipients this transaction has just claimed (see the file
-- header): the code a recipient already holds, else a free one taken FOR UPDATE SKIP LOCKED,
-- in slot order from the random %(slot)s on, wrapping around (the second branch runs only
-- when the first found too few: the outer LIMIT stops the Append).
-- Returns (seq, code) for every recipient that has one now; a seq missing from the answer
-- found the pool empty. The last SELECT reads the bindings committed before this statement
-- (the held codes); the new ones come from `bound`'s RETURNING. `free` is MATERIALIZED: the
-- codes it locked are read once, whatever join the update's plan uses.
WITH asked AS (
    SELECT DISTINCT a.seq FROM unnest(%(seqs)s::int[]) AS a(seq)
), held AS (
    SELECT p.seq, p.code FROM promo_codes p
     WHERE p.campaign_id = %(campaign_id)s AND p.seq IN (SELECT seq FROM asked)
), want AS (
    SELECT a.seq, row_number() OVER (ORDER BY a.seq) AS n
      FROM asked a WHERE a.seq NOT IN (SELECT seq FROM held)
), free AS MATERIALIZED (
    SELECT f.code, row_number() OVER () AS n
      FROM (SELECT a.code FROM (SELECT code FROM promo_codes
                                 WHERE campaign_id = %(campaign_id)s AND seq IS NULL
                                   AND slot >= %(slot)s
                                 ORDER BY slot LIMIT (SELECT count(*) FROM want)
                                   FOR UPDATE SKIP LOCKED) a
            UNION ALL
            SELECT b.code FROM (SELECT code FROM promo_codes
                                 WHERE campaign_id = %(campaign_id)s AND seq IS NULL
                                   AND slot < %(slot)s
                                 ORDER BY slot LIMIT (SELECT count(*) FROM want)
                                   FOR UPDATE SKIP LOCKED) b
             LIMIT (SELECT count(*) FROM want)) f
), bound AS (
    UPDATE promo_codes p SET seq = want.seq, bound_at = now()
      FROM want JOIN free ON free.n = want.n
     WHERE p.campaign_id = %(campaign_id)s AND p.code = free.code AND p.seq IS NULL
    RETURNING p.seq, p.code
)
SELECT seq, code FROM held
UNION ALL
SELECT seq, code FROM bound;

-- name: release_codeless
-- Recipients claimed by this transaction for whom the pool had no code go back to pending,
-- flagged for requeue (their doorbell is consumed) with reason promo_pool_empty: nothing is
-- sent without a code. Run in the claim's transaction, which still holds their row locks, and
-- followed there by set_campaign_status (paused, promo_pool_empty). {partition} as in
-- record_results.
UPDATE {partition} r
   SET status = 'pending', reason = 'promo_pool_empty', requeue = true
 WHERE r.campaign_id = %(campaign_id)s AND r.seq = ANY(%(seqs)s::int[]) AND r.status = 'sending';

-- name: promo_counts
-- Codes issued (bound) and left (free) for `campaign status` and `report`; each count reads one
-- partial index. NULL, NULL when the campaign has no pool.
SELECT CASE WHEN c.promo_pool THEN
            (SELECT count(*) FROM promo_codes p
              WHERE p.campaign_id = c.id AND p.seq IS NOT NULL) END AS issued,
       CASE WHEN c.promo_pool THEN
            (SELECT count(*) FROM promo_codes p
              WHERE p.campaign_id = c.id AND p.seq IS NULL) END AS free
  FROM campaigns c WHERE c.id = %(campaign_id)s;

-- name: promo_bindings_check
-- The pool's invariants, read from the rows (demo, chaos, tests): codes bound, distinct codes
-- bound, recipients holding a code, recipients holding more than one, and rows sent without
-- a code.
SELECT (SELECT count(*) FROM promo_codes WHERE campaign_id = %(campaign_id)s
          AND seq IS NOT NULL) AS bound,
       (SELECT count(DISTINCT code) FROM promo_codes WHERE campaign_id = %(campaign_id)s
          AND seq IS NOT NULL) AS distinct_codes,
       (SELECT count(DISTINCT seq) FROM promo_codes WHERE campaign_id = %(campaign_id)s
          AND seq IS NOT NULL) AS holders,
       (SELECT count(*) FROM (SELECT seq FROM promo_codes WHERE campaign_id = %(campaign_id)s
                                 AND seq IS NOT NULL GROUP BY seq HAVING count(*) > 1) d)
          AS holding_two,
       (SELECT count(*) FROM campaign_recipients r
         WHERE r.campaign_id = %(campaign_id)s AND r.status = 'sent'
           AND NOT EXISTS (SELECT 1 FROM promo_codes p
                            WHERE p.campaign_id = r.campaign_id AND p.seq = r.seq))
          AS sent_without_code;
