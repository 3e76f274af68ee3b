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
