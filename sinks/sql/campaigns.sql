-- name: create_campaign
INSERT INTO campaigns (name, template, from_address, configuration_set, rate_limit,
                       audience_condition, channel, rate_unit)
VALUES (%(name)s, %(template)s, %(from_address)s, %(configuration_set)s, %(rate_limit)s,
        %(audience_condition)s, %(channel)s, %(rate_unit)s)
RETURNING id;

-- name: get_campaign
SELECT id, name, template, from_address, configuration_set, rate_limit, audience_condition,
       status, reason, recipients, created_at, started_at, snapshot_done_at, produced_at,
       paused_at, finished_at, channel
  FROM campaigns WHERE id = %(id)s;

-- name: begin_snapshot
-- Only a draft campaign can start: the conditional UPDATE is the lock, so starting twice
-- (or from two terminals at once) snapshots once.
UPDATE campaigns SET status = 'snapshotting', started_at = now(), updated_at = now()
 WHERE id = %(id)s AND status = 'draft'
RETURNING id;

-- name: finish_snapshot
-- clock_timestamp(): the snapshot runs in the transaction that set started_at = now().
-- duplicate_addresses and invalid_addresses were set by count_snapshot.
-- NOTIFY (delivered at commit): every worker's cache sees `sending` before the first doorbell.
WITH changed AS (
    UPDATE campaigns SET status = 'sending', recipients = %(recipients)s,
           snapshot_done_at = clock_timestamp(),
           updated_at = now()
     WHERE id = %(id)s AND status = 'snapshotting'
    RETURNING id
)
SELECT id, pg_notify('flashsend_campaigns', id::text) FROM changed;

-- name: mark_produced
-- The weights of the first produce stay: a later produce (after a failed one) covers only
-- the rows still pending, not the campaign's spread over the partitions.
UPDATE campaigns
   SET produced_at = now(), updated_at = now(),
       partition_weights = coalesce(partition_weights, %(weights)s::int[])
 WHERE id = %(id)s;

-- name: live_campaigns
-- Polled by every worker a few times a second: tiny table. Recently finished campaigns are
-- included so a lane holding rows of a just-cancelled campaign releases them as cancelled.
-- sending_elapsed_s is the ramp's clock as of this statement (migration 0024);
-- sending_began_s_ago how long ago the snapshot made its rows sendable (NULL before).
SELECT id, status, rate_limit, template, from_address, configuration_set, name,
       partition_weights, variants, ramp,
       sending_s + coalesce(extract(epoch FROM clock_timestamp() - sending_since)::float8, 0)
           AS sending_elapsed_s,
       extract(epoch FROM clock_timestamp() - snapshot_done_at)::float8 AS sending_began_s_ago,
       channel, rate_unit, push_ttl_s, push_collapse_key
  FROM campaigns
 WHERE status IN ('sending', 'paused', 'snapshotting')
    OR (status IN ('cancelled', 'done', 'failed') AND updated_at > now() - interval '1 hour');

-- name: set_campaign_status
-- Control commands (pause/resume/cancel) and automatic pauses; the WHERE lists the states
-- the transition is allowed from, so a racing command cannot resurrect a finished campaign.
-- NOTIFY (delivered at commit) wakes every worker's campaign cache at once.
WITH changed AS (
    UPDATE campaigns
       SET status = %(status)s, reason = %(reason)s, updated_at = now(),
           paused_at = CASE WHEN %(status)s = 'paused' THEN now() ELSE paused_at END,
           finished_at = CASE WHEN %(status)s IN ('cancelled', 'done', 'failed') THEN now()
                              ELSE finished_at END
     WHERE id = %(id)s AND status = ANY(%(from_statuses)s)
    RETURNING id
)
SELECT id, pg_notify('flashsend_campaigns', id::text) FROM changed;

-- name: campaign_counts
-- Progress in one pass over one campaign's rows (no index on status by design; the primary
-- key prefix limits the scan to this campaign).
SELECT status, count(*) AS n FROM campaign_recipients
 WHERE campaign_id = %(id)s GROUP BY status;

-- name: campaign_progress
-- Everything `campaign status` shows, from the trigger-kept counters (migration 0010): a sum
-- over at most 64 x 7 rows, whatever the campaign's size. Counting the rows themselves took
-- 0.9-2 s on 860k recipients (no index on status by design, seed trap 5). A seed list's
-- rows (user id < 0, streams/rules/seed_list.py) are counted apart in `seed`, through the
-- (campaign_id, user_id) index: CampaignStore.progress takes them out of the audience's
-- figures, and one statement keeps both counts of one snapshot.
SELECT c.id, c.name, c.status, c.reason, c.rate_limit, c.rate_unit, c.channel, c.recipients,
       c.started_at, c.snapshot_done_at, c.produced_at, c.paused_at, c.finished_at,
       c.duplicate_addresses, c.invalid_addresses, c.correction_of, c.seed_recipients,
       c.hold_until, c.hold_released_at, c.hold_released_by, s.seed,
       extract(epoch FROM now() - c.started_at) AS elapsed_s,
       p.pending, p.sending, p.sent, p.failed, p.unknown, p.skipped, p.cancelled, p.held,
       extract(epoch FROM p.first_sent_at) AS first_sent_epoch,
       extract(epoch FROM p.last_sent_at) AS last_sent_epoch
  FROM campaigns c,
       LATERAL (
         SELECT coalesce(sum(n) FILTER (WHERE status = 'pending'), 0)::bigint   AS pending,
                coalesce(sum(n) FILTER (WHERE status = 'sending'), 0)::bigint   AS sending,
                coalesce(sum(n) FILTER (WHERE status = 'sent'), 0)::bigint      AS sent,
                coalesce(sum(n) FILTER (WHERE status = 'failed'), 0)::bigint    AS failed,
                coalesce(sum(n) FILTER (WHERE status = 'unknown'), 0)::bigint   AS unknown,
                coalesce(sum(n) FILTER (WHERE status = 'skipped'), 0)::bigint   AS skipped,
                coalesce(sum(n) FILTER (WHERE status = 'cancelled'), 0)::bigint AS cancelled,
                coalesce(sum(n) FILTER (WHERE status = 'held'), 0)::bigint      AS held,
                min(first_sent_at) AS first_sent_at,
                max(last_sent_at) AS last_sent_at
           FROM campaign_status_counts k WHERE k.campaign_id = c.id
       ) p,
       LATERAL (
         SELECT jsonb_object_agg(x.status, x.n) AS seed
           FROM (SELECT r.status, count(*) AS n FROM campaign_recipients r
                  WHERE r.campaign_id = %(id)s AND r.user_id < 0 AND c.seed_recipients > 0
                  GROUP BY r.status) x
       ) s
 WHERE c.id = %(id)s;

-- name: cancel_pending
-- Cancel: every still-pending recipient, and an A/B test's holdout still `held`, becomes
-- cancelled in one statement; rows in flight ('sending') are finished by their lane, which
-- sees the cancelled campaign and releases them. set_winner releases `held` rows only while
-- the campaign is sending or paused, so after the cancel none comes back.
UPDATE campaign_recipients SET status = 'cancelled', reason = 'campaign_cancelled', requeue = false
 WHERE campaign_id = %(id)s AND status IN ('pending', 'held');

-- name: report_reasons
-- The audience's rows: a seed list's (user id < 0) are listed apart (seed_rows).
SELECT status, coalesce(reason, '') AS reason, count(*) AS n FROM campaign_recipients
 WHERE campaign_id = %(id)s AND user_id >= 0 GROUP BY status, reason ORDER BY status, n DESC;

-- name: report_rate
-- Recipients sent per bucket of %(bucket_s)s seconds since the first send.
SELECT floor(extract(epoch FROM sent_at - first.t) / %(bucket_s)s)::int AS bucket, count(*) AS n
  FROM campaign_recipients,
       (SELECT min(sent_at) AS t FROM campaign_recipients WHERE campaign_id = %(id)s) AS first
 WHERE campaign_id = %(id)s AND status = 'sent'
 GROUP BY 1 ORDER BY 1;

-- name: feedback_lag
-- Seconds the feedback agent's oldest unapplied event has waited, from the reports younger
-- than %(fresh_s)s: 0 when none is behind, NULL when no agent reports. Polled with
-- live_campaigns; a handful of rows (streams/rules/feedback_lag.py).
SELECT CASE WHEN count(*) > 0
            THEN coalesce(extract(epoch FROM now() - min(waiting_since))::float8, 0) END
  FROM feedback_progress
 WHERE reported_at > now() - make_interval(secs => %(fresh_s)s);
