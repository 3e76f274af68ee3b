-- The 24-hour SES quota at campaign start (producers/send_quota.py).

-- name: lock_quota
-- Taken in the snapshot's transaction before counting what other campaigns hold, kept until
-- its commit: two starts at once check one after the other, and the second sees the first's
-- committed rows (a snapshot's rows are invisible to others until its commit).
SELECT pg_advisory_xact_lock(hashtext('flashsend_daily_quota'));

-- name: quota_held_by_others
-- Recipients the other live campaigns (any status but draft and the finished ones, so paused
-- and held campaigns count) will still send: their pending, in-flight and held rows, from the
-- trigger-kept counters (migration 0010); 'requeue' is a subset of pending, not added.
SELECT coalesce(sum(k.n), 0)::bigint
  FROM campaign_status_counts k JOIN campaigns c ON c.id = k.campaign_id
 WHERE c.id <> %(id)s
   AND c.status NOT IN ('draft', 'cancelled', 'done', 'failed')
   AND k.status IN ('pending', 'sending', 'held');

-- name: spread_over_quota
-- `campaign start --spread-over-quota`, in the snapshot's transaction over the campaign's own
-- detached partition (no one else sees it yet), after count_snapshot: the pending rows in seq
-- order, %(per_day)s a day; day 0's stay pending, day k's become `held` with send_after
-- %(now)s + k periods, so each day is one contiguous seq range and record_slots makes it a
-- slot the scheduler releases when due. The counters count_snapshot wrote move with them.
WITH ranked AS (
    SELECT seq, (row_number() OVER (ORDER BY seq) - 1) / %(per_day)s AS day
      FROM {partition} WHERE status = 'pending'
), moved AS (
    UPDATE {partition} r
       SET status = 'held',
           send_after = %(now)s::timestamptz + ranked.day * %(period_s)s * interval '1 second'
      FROM ranked
     WHERE r.seq = ranked.seq AND ranked.day > 0
    RETURNING r.seq
), n AS (
    SELECT count(*) AS n FROM moved
), counters AS (
    INSERT INTO campaign_status_counts AS c (campaign_id, shard, status, n)
    SELECT %(campaign_id)s, 0, d.status, d.sign * n.n
      FROM n, (VALUES ('held', 1), ('pending', -1)) AS d(status, sign)
     WHERE n.n > 0
    ON CONFLICT (campaign_id, shard, status) DO UPDATE SET n = c.n + EXCLUDED.n
)
SELECT n FROM n;
