-- Rows in doubt: settled by SES's own events (the feedback agent), queued again by an
-- operator (`flashsend campaign resend-unknown`). Rules: streams/rules/resolution.py.

-- name: resolve_in_doubt
-- One batch of proofs (streams.rules.resolution.settle: one per row, (campaign, seq) order), in the
-- feedback agent's transaction that advances the fenced offsets. Safe under concurrency:
-- every writer of a recipient row changes it only from a given status (record_results from
-- 'sending', expire_leases from 'sending', a claim from 'pending', resend_unknown from
-- 'unknown'), and so does this statement; the rows are locked in (campaign, seq) order (the
-- order of the proofs) and READ COMMITTED re-checks the status on the locked row, so whichever
-- commits first wins and the other finds nothing to do. A replayed event finds its row
-- settled: idempotent. The address must be the row's too, so a tag from another database
-- sharing the SES account changes nothing here. Campaigns with no row unknown, sending or pending (trigger-kept
-- counters) are not probed, except for a failure (rare), which may overturn a 'sent' that
-- an event made. Updates go through the parent, whose counter trigger fires (migration 0010);
-- = ANY(%(campaigns)s) lets the planner drop the other campaigns' partitions. Each proof
-- probes its own row by primary key (LATERAL … LIMIT 1), whatever the statistics say: those
-- of a young campaign (taken at its snapshot) count no row unknown or sending, and with a
-- plain join the planner may then put the partition outside a loop over the proofs.
WITH proof AS (
    SELECT *
      FROM unnest(%(campaign_ids)s::bigint[], %(seqs)s::int[], %(emails)s::text[],
                  %(outcomes)s::text[], %(message_ids)s::text[], %(at_ms)s::bigint[])
           AS p(campaign_id, seq, email, outcome, message_id, at_ms)
), in_doubt AS (
    SELECT campaign_id FROM campaign_status_counts
     WHERE campaign_id = ANY(%(campaigns)s::bigint[])
       AND status IN ('unknown', 'sending', 'pending')
     GROUP BY campaign_id
    HAVING sum(n) > 0
), target AS (
    SELECT r.campaign_id, r.seq, r.status AS was, p.outcome, p.message_id, p.at_ms
      FROM proof p
     CROSS JOIN LATERAL (
            SELECT r.campaign_id, r.seq, r.status
              FROM campaign_recipients r
             WHERE r.campaign_id = p.campaign_id AND r.seq = p.seq
               AND r.campaign_id = ANY(%(campaigns)s::bigint[])
               AND lower(btrim(r.email)) = p.email
               AND (r.status IN ('unknown', 'sending')
                    OR (r.status = 'pending' AND r.reason = 'resend_unknown')
                    OR (r.status = 'sent' AND p.outcome = 'failed'
                        AND r.reason IN ('resolved_by_event', 'event_before_answer')))
             LIMIT 1
               FOR UPDATE
          ) r
     WHERE p.campaign_id IN (SELECT campaign_id FROM in_doubt) OR p.outcome = 'failed'
)
UPDATE campaign_recipients r
   SET status = t.outcome,
       reason = CASE WHEN t.was = 'sending' THEN 'event_before_answer'
                     WHEN t.was = 'sent' THEN r.reason
                     ELSE 'resolved_by_event' END,
       message_id = coalesce(r.message_id, t.message_id),
       sent_at = CASE WHEN t.outcome = 'sent' THEN to_timestamp(t.at_ms / 1000.0)
                      ELSE r.sent_at END,
       requeue = false
  FROM target t
 WHERE r.campaign_id = t.campaign_id AND r.seq = t.seq
   AND r.campaign_id = ANY(%(campaigns)s::bigint[])
RETURNING r.campaign_id, r.seq, t.was, r.status;

-- name: unknown_rows_to_resend
-- resend-unknown's plan (and its dry run): rows still unknown whose call started longer ago
-- than the grace. Still unknown means no event has proved them (resolve_in_doubt). A read:
-- the resend itself checks the same condition again under its locks. Scans the campaign's
-- rows (primary-key prefix), an operator command.
SELECT seq, user_id, email, reason, claimed_at
  FROM campaign_recipients
 WHERE campaign_id = %(campaign_id)s AND status = 'unknown'
   AND claimed_at < now() - make_interval(secs => %(older_than_s)s)
 ORDER BY seq;

-- name: resend_unknown
-- The rows of the plan go back to pending, flagged requeue (reconcile's take_requeue
-- produces their doorbells), with reason resend_unknown; a done campaign goes back to
-- sending; one audit row lists exactly the seqs moved. The caller holds the campaign's
-- reconcile lock (pg_advisory_xact_lock(0x5EC0, id)), so no reconcile pass can mark the
-- campaign done between this and the produce; the campaign row is locked first (FOR UPDATE)
-- so a concurrent pause/cancel waits, and only rows still unknown move: an event that
-- settled one meanwhile wins. %(seqs)s: the plan shown, so nothing unseen is resent.
WITH campaign AS (
    SELECT id, status FROM campaigns
     WHERE id = %(campaign_id)s AND status IN ('sending', 'paused', 'done')
       FOR UPDATE
), moved AS (
    UPDATE campaign_recipients r
       SET status = 'pending', reason = 'resend_unknown', requeue = true
      FROM campaign c
     WHERE r.campaign_id = c.id AND r.campaign_id = %(campaign_id)s
       AND r.seq = ANY(%(seqs)s::int[]) AND r.status = 'unknown'
       AND r.claimed_at < now() - make_interval(secs => %(older_than_s)s)
    RETURNING r.seq
), reopened AS (
    UPDATE campaigns c
       SET status = 'sending', reason = 'resend_unknown', finished_at = NULL, updated_at = now()
      FROM campaign
     WHERE c.id = campaign.id AND campaign.status = 'done' AND EXISTS (SELECT 1 FROM moved)
    RETURNING c.id
), audit AS (
    INSERT INTO unknown_resends (requested_by, host, reason, campaign_id, campaign_status,
                                 older_than_s, recipients, seqs)
    SELECT %(requested_by)s, %(host)s, %(reason)s, campaign.id, campaign.status,
           %(older_than_s)s, count(moved.seq),
           coalesce(array_agg(moved.seq ORDER BY moved.seq) FILTER (WHERE moved.seq IS NOT NULL),
                    '{}')
      FROM campaign LEFT JOIN moved ON true
     GROUP BY campaign.id, campaign.status
    RETURNING id
)
SELECT (SELECT status FROM campaign) AS campaign_status,
       (SELECT count(*) FROM moved) AS moved,
       (SELECT count(*) FROM reopened) AS reopened,
       (SELECT id FROM audit) AS audit_id,
       (SELECT pg_notify('flashsend_campaigns', id::text) FROM reopened) AS notified;

-- name: resends_of_campaign
SELECT coalesce(sum(recipients), 0)::bigint AS recipients, count(*) AS times
  FROM unknown_resends WHERE campaign_id = %(campaign_id)s;
