-- Deliverability: the feedback agent's effects and the one-click unsubscribe.

-- name: apply_feedback
-- One batch of feedback events, one statement, in the transaction that also advances the
-- fenced offsets. The caller sends one row per event id, in id order. Only events never seen
-- before have effects (feedback_seen: SNS delivers at
-- least once), so counters stay exact and a redelivered bounce changes nothing. Suppressions
-- are ON CONFLICT DO NOTHING (the first reason stays). Counter rows are upserted in campaign id
-- order and suppressions in address order, so two workers never lock in opposite orders.
-- Events tagged with a campaign this database does not know count nowhere.
WITH ev AS (
    SELECT *
      FROM unnest(%(event_ids)s::uuid[], %(emails)s::text[], %(campaign_ids)s::bigint[],
                  %(counters)s::text[], %(suppress)s::text[], %(sources)s::text[],
                  %(variants)s::text[], %(variant_counters)s::text[], %(engaged)s::text[],
                  %(engaged_seqs)s::int[], %(engaged_at)s::float8[])
           AS e(event_id, email, campaign_id, counter, suppress, source, variant, variant_counter,
                engaged, engaged_seq, engaged_at)
), fresh AS (
    INSERT INTO feedback_seen (event_id)
    SELECT event_id FROM ev ORDER BY event_id
    ON CONFLICT DO NOTHING
    RETURNING event_id
), new_ev AS (
    SELECT ev.* FROM ev JOIN fresh USING (event_id)
), suppressed AS (
    INSERT INTO email_suppressions (email, reason, source_event)
    SELECT DISTINCT ON (email) email, suppress, source
      FROM new_ev WHERE suppress IS NOT NULL
     ORDER BY email, suppress DESC  -- 'complaint' before 'bounce' for the same address
    ON CONFLICT (email) DO NOTHING
    RETURNING email
), counted AS (
    INSERT INTO campaign_feedback AS f
           (campaign_id, sent, delivered, bounced, soft_bounced, complained, rejected, delayed,
            rendering_failed, unsubscribed)
    SELECT n.campaign_id,
           count(*) FILTER (WHERE counter = 'sent'),
           count(*) FILTER (WHERE counter = 'delivered'),
           count(*) FILTER (WHERE counter = 'bounced'),
           count(*) FILTER (WHERE counter = 'soft_bounced'),
           count(*) FILTER (WHERE counter = 'complained'),
           count(*) FILTER (WHERE counter = 'rejected'),
           count(*) FILTER (WHERE counter = 'delayed'),
           count(*) FILTER (WHERE counter = 'rendering_failed'),
           count(*) FILTER (WHERE counter = 'unsubscribed')
      FROM new_ev n JOIN campaigns c ON c.id = n.campaign_id
     WHERE n.counter IS NOT NULL
     GROUP BY n.campaign_id
     ORDER BY n.campaign_id
    ON CONFLICT (campaign_id) DO UPDATE
       SET sent = f.sent + excluded.sent,
           delivered = f.delivered + excluded.delivered,
           bounced = f.bounced + excluded.bounced,
           soft_bounced = f.soft_bounced + excluded.soft_bounced,
           complained = f.complained + excluded.complained,
           rejected = f.rejected + excluded.rejected,
           delayed = f.delayed + excluded.delayed,
           rendering_failed = f.rendering_failed + excluded.rendering_failed,
           unsubscribed = f.unsubscribed + excluded.unsubscribed,
           updated_at = now()
    RETURNING f.*
), variant_counted AS (
    -- An A/B test's counters per variant (the mail's `variant` tag), in (campaign, variant)
    -- order like the campaign counters. Runs whether or not the result reads it.
    INSERT INTO campaign_variant_feedback AS v
           (campaign_id, variant, delivered, bounced, complained, opened, clicked)
    SELECT n.campaign_id, n.variant,
           count(*) FILTER (WHERE variant_counter = 'delivered'),
           count(*) FILTER (WHERE variant_counter = 'bounced'),
           count(*) FILTER (WHERE variant_counter = 'complained'),
           count(*) FILTER (WHERE variant_counter = 'opened'),
           count(*) FILTER (WHERE variant_counter = 'clicked')
      FROM new_ev n JOIN campaigns c ON c.id = n.campaign_id
     WHERE n.variant IS NOT NULL AND n.variant_counter IS NOT NULL
     GROUP BY n.campaign_id, n.variant
     ORDER BY n.campaign_id, n.variant
    ON CONFLICT (campaign_id, variant) DO UPDATE
       SET delivered = v.delivered + excluded.delivered,
           bounced = v.bounced + excluded.bounced,
           complained = v.complained + excluded.complained,
           opened = v.opened + excluded.opened,
           clicked = v.clicked + excluded.clicked,
           updated_at = now()
    RETURNING v.campaign_id
), engaged AS (
    -- An Open or Click dates the user behind the mail's row (campaign, seq), while that row
    -- still has the event's address: users.last_open_at / last_click_at, what `--waves`
    -- orders the audience by. The latest time wins, so a late or redelivered event moves
    -- nothing back; an event without a time counts as now. Events of one address come on one
    -- partition (mail.events is keyed by it), so one worker updates a user at a time.
    UPDATE users u
       SET last_open_at = greatest(u.last_open_at, e.opened),
           last_click_at = greatest(u.last_click_at, e.clicked)
      FROM (SELECT r.user_id,
                   max(coalesce(to_timestamp(n.engaged_at), now()))
                       FILTER (WHERE n.engaged = 'open') AS opened,
                   max(coalesce(to_timestamp(n.engaged_at), now()))
                       FILTER (WHERE n.engaged = 'click') AS clicked
              FROM new_ev n
              JOIN campaign_recipients r
                ON r.campaign_id = n.campaign_id AND r.seq = n.engaged_seq
             WHERE n.engaged IS NOT NULL AND lower(btrim(r.email)) = n.email
             GROUP BY r.user_id) e
     WHERE u.id = e.user_id
    RETURNING u.id
)
SELECT (SELECT count(*) FROM fresh) AS fresh,
       (SELECT count(*) FROM suppressed) AS suppressed,
       (SELECT coalesce(json_agg(k), '[]'::json)
          FROM (SELECT counted.*, c.status
                  FROM counted JOIN campaigns c ON c.id = counted.campaign_id) k)
         AS campaigns;

-- name: auto_pause_campaign
-- The agent decided (streams.rules.feedback_logic.pause_reason) in this same transaction, on the
-- counters it just wrote under their row lock. Only a campaign still sending is paused; the
-- window restarts from the current counters, so after a resume the rates are judged on new mail.
WITH paused AS (
    UPDATE campaigns
       SET status = 'paused', reason = %(reason)s, paused_at = now(), updated_at = now()
     WHERE id = %(campaign_id)s AND status = 'sending'
    RETURNING id
)
UPDATE campaign_feedback f
   SET window_sent = f.sent, window_delivered = f.delivered, window_bounced = f.bounced,
       window_complained = f.complained, auto_paused_at = now(), auto_pause_reason = %(reason)s
  FROM paused WHERE f.campaign_id = paused.id
RETURNING f.campaign_id;

-- name: purge_feedback_seen
-- Dedupe ids older than the horizon (must outlive mail.events' retention: a replay older
-- than that could count twice). Batched so the delete never holds many locks for long.
DELETE FROM feedback_seen
 WHERE event_id IN (SELECT event_id FROM feedback_seen
                     WHERE seen_at < %(horizon)s ORDER BY seen_at LIMIT %(limit)s);

-- name: campaign_feedback
SELECT f.*, c.status, c.reason FROM campaign_feedback f JOIN campaigns c ON c.id = f.campaign_id
 WHERE f.campaign_id = %(campaign_id)s;

-- name: unsubscribe_user
-- RFC 8058 one-click POST: opt the user out of marketing and write the Unsubscribed event in
-- the same statement (the webhook's outbox; the relay publishes it later, so this never waits
-- for Kafka). Conditional on marketing_opt_in: a repeated POST changes nothing and writes no
-- second event. The NOTIFY is the relay's doorbell (delivered at commit).
WITH changed AS (
    UPDATE users SET marketing_opt_in = false, opted_out_at = now()
     WHERE id = %(user_id)s AND marketing_opt_in
    RETURNING id, email
), event AS (
    INSERT INTO feedback_outbox (topic, msg_key, schema_name, event_type, dedupe_key, payload)
    SELECT %(topic)s, lower(btrim(c.email)), 'unsubscribed', 'Unsubscribed',
           'unsubscribed:' || c.id || ':' || coalesce(%(campaign_id)s::bigint::text, '-'),
           jsonb_build_object('user_id', c.id, 'campaign_id', %(campaign_id)s::bigint,
                              'email', lower(btrim(c.email)), 'key_id', %(key_id)s::text,
                              'method', 'one_click')
      FROM changed c
    RETURNING event_id
)
SELECT (SELECT count(*) FROM changed) AS changed,
       (SELECT event_id FROM event) AS event_id,
       (SELECT count(*) FROM (SELECT pg_notify('feedback_outbox', '') FROM event) n) AS notified;

-- name: committed_marketing_rate
-- Campaign preflight: the limits of the other campaigns that are, or may resume,
-- sending. They share the account's MaxSendRate minus the transactional reserve with the new one.
-- SMS campaigns send through another provider: they take nothing of SES's rate.
SELECT coalesce(sum(rate_limit), 0) FROM campaigns
 WHERE id <> %(id)s AND status IN ('snapshotting', 'sending', 'paused') AND channel = 'email';

-- name: report_feedback_progress
-- The agent's lag report (streams/rules/feedback_lag.py): per partition of mail.events it owns,
-- since when (epoch seconds) its oldest event not yet applied has waited; NULL: none waits.
INSERT INTO feedback_progress AS f (topic, partition, waiting_since, reported_at)
SELECT %(topic)s, r.p, to_timestamp(r.w), now()
  FROM unnest(%(partitions)s::int[], %(waiting)s::float8[]) AS r(p, w)
ON CONFLICT (topic, partition) DO UPDATE
   SET waiting_since = excluded.waiting_since, reported_at = excluded.reported_at;
