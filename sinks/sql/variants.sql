-- A/B test, then the winner (streams/rules/ab_test.py, sinks/variant_store.py).

-- name: set_campaign_variants
-- At create, in the transaction that inserted the draft: only a draft takes variants, so a
-- started campaign's assignment never changes under its rows.
UPDATE campaigns
   SET variants = %(variants)s::jsonb, holdout_wait_s = %(holdout_wait_s)s,
       winner_by = %(winner_by)s, updated_at = now()
 WHERE id = %(id)s AND status = 'draft'
RETURNING id;

-- name: ab_state
-- The wait counts from when the test share starts: the end of the snapshot, or the end of a
-- seed hold (NULL while the hold lasts: no winner is due).
SELECT id, status, variants, holdout_wait_s, winner_by, winner, winner_at, winner_reason,
       CASE WHEN hold_until IS NULL THEN snapshot_done_at ELSE hold_released_at END
  FROM campaigns WHERE id = %(id)s;

-- name: variant_rows
-- Rows per variant and status: a scan of the campaign's own partition (no index on status
-- by design), run only for campaigns with variants, by status, report and the winner choice.
SELECT variant, status, count(*) AS n FROM campaign_recipients
 WHERE campaign_id = %(id)s GROUP BY variant, status;

-- name: variant_feedback
SELECT variant, delivered, bounced, complained, opened, clicked
  FROM campaign_variant_feedback WHERE campaign_id = %(id)s;

-- name: set_winner
-- The one decision of an A/B test, whoever makes it (a worker's reconcile tick, `campaign
-- promote`, two of them at once). The guard `winner IS NULL` on the campaign row is the
-- claim: a second decider waits for the first one's row lock, then re-checks the guard on the
-- committed row and finds a winner, so it sets nothing and releases nothing; a repeated call
-- is a no-op the same way. Only a sending or paused campaign releases its holdout (a cancelled
-- one keeps it cancelled: cancel_pending takes `held` rows too). The holdout's rows become
-- pending with the winner's name and the requeue flag, in the same statement: reconcile's
-- take_requeue produces their doorbells (at once by the caller, else at the next tick; on
-- resume when paused). While a seed hold lasts no winner is set: the test share is held too
-- (release_hold). The NOTIFY wakes the workers' campaign caches.
WITH won AS (
    UPDATE campaigns
       SET winner = %(variant)s, winner_at = now(), winner_reason = %(reason)s,
           updated_at = now()
     WHERE id = %(id)s AND winner IS NULL AND status IN ('sending', 'paused')
       AND (hold_until IS NULL OR hold_released_at IS NOT NULL)  -- test share sent first
       AND variants @> jsonb_build_array(jsonb_build_object('name', %(variant)s::text))
    RETURNING id
), released AS (
    UPDATE campaign_recipients r
       SET status = 'pending', variant = %(variant)s, requeue = true
      FROM won
     WHERE r.campaign_id = won.id AND r.campaign_id = %(id)s AND r.status = 'held'
    RETURNING r.seq
)
SELECT (SELECT count(*) FROM won) AS won, (SELECT count(*) FROM released) AS released,
       (SELECT count(*) FROM (SELECT pg_notify('flashsend_campaigns', id::text) FROM won) n)
         AS notified;
