-- Scheduled sending: a local-time window or engagement waves (streams/rules/send_plan.py,
-- sinks/schedule_store.py, producers/send_schedule.py).

-- name: set_campaign_schedule
-- At create, in the transaction that inserted the draft: only a draft takes a plan, so a
-- started campaign's send_after never changes under its rows.
UPDATE campaigns SET schedule = %(schedule)s::jsonb, updated_at = now()
 WHERE id = %(id)s AND status = 'draft'
RETURNING id;

-- name: campaign_schedule
SELECT schedule FROM campaigns WHERE id = %(id)s;

-- name: audience_zones
-- The zones of the audience and their user counts, read before the snapshot to plan each
-- zone's send_after. A read only; a zone that appears after it falls back to the default
-- zone in the snapshot. {audience} as in snapshot_recipients.
SELECT u.timezone, count(*) AS n FROM users u WHERE ({audience}) GROUP BY u.timezone;

-- name: record_slots
-- In the snapshot's transaction, over the campaign's own detached partition (no one else sees
-- it yet): one slot per distinct send_after with its seq range, contiguous because the
-- snapshot numbers seq by (send_after, user id). Slots due at %(now)s are released already
-- (their rows were snapshotted pending and are produced by the start).
INSERT INTO campaign_slots (campaign_id, slot_at, first_seq, last_seq, recipients, released_at)
SELECT %(campaign_id)s, send_after, min(seq), max(seq), count(*),
       CASE WHEN send_after <= %(now)s::timestamptz THEN %(now)s::timestamptz END
  FROM {partition} WHERE send_after IS NOT NULL
 GROUP BY send_after;

-- name: note_schedule
-- In the snapshot's transaction, which holds the campaign row: what planning found (unknown
-- zone names and their user counts) for status and the report.
UPDATE campaigns SET schedule = coalesce(schedule, '{}'::jsonb) || %(notes)s::jsonb
 WHERE id = %(id)s;

-- name: release_due_slots
-- The scheduler's one transition, run by every worker's reconcile tick (and on resume) with
-- its clock's %(now)s: the campaign's slots due and not yet released are marked released and
-- their rows still `held` become pending with the requeue flag, in one statement; reconcile's
-- take_requeue produces their doorbells. The campaign row is read FOR SHARE with the guard
-- status = 'sending': a pause or cancel either commits first (this sees it and releases
-- nothing) or waits for this to commit (then the claims flag the rows for resume, or
-- cancel_pending takes them). Two schedulers racing on a slot serialise on its row and the
-- second re-checks `released_at IS NULL` and skips it. The rows are found by the slot's seq
-- range (primary key), never by a scan of the campaign.
WITH campaign AS (
    SELECT id FROM campaigns WHERE id = %(id)s AND status = 'sending' FOR SHARE
), due AS (
    UPDATE campaign_slots s SET released_at = %(now)s::timestamptz
      FROM campaign c
     WHERE s.campaign_id = c.id AND s.campaign_id = %(id)s
       AND s.released_at IS NULL AND s.slot_at <= %(now)s::timestamptz
    RETURNING s.first_seq, s.last_seq
), released AS (
    UPDATE campaign_recipients r SET status = 'pending', requeue = true
      FROM due
     WHERE r.campaign_id = %(id)s AND r.seq BETWEEN due.first_seq AND due.last_seq
       AND r.status = 'held'
    RETURNING r.seq
)
SELECT (SELECT count(*) FROM due) AS slots, (SELECT count(*) FROM released) AS released;

-- name: next_slot
-- The earliest slot not yet released (NULL when none): what status says is next.
SELECT min(slot_at) FROM campaign_slots WHERE campaign_id = %(id)s AND released_at IS NULL;

-- name: slot_progress
-- Progress per slot for status and the report: a primary-key range scan of each slot's rows,
-- that is one pass over the campaign (no index on status by design), run only for scheduled
-- campaigns.
SELECT s.slot_at, s.recipients, s.released_at,
       count(*) FILTER (WHERE r.status = 'sent') AS sent,
       count(*) FILTER (WHERE r.status = 'held') AS waiting,
       count(*) FILTER (WHERE r.status IN ('pending', 'sending')) AS in_progress,
       count(*) FILTER (WHERE r.status NOT IN ('sent', 'held', 'pending', 'sending')) AS other
  FROM campaign_slots s
  JOIN campaign_recipients r
    ON r.campaign_id = %(id)s AND r.seq BETWEEN s.first_seq AND s.last_seq
 WHERE s.campaign_id = %(id)s
 GROUP BY s.slot_at, s.recipients, s.released_at
 ORDER BY s.slot_at;
