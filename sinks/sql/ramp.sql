-- Rate ramp (streams/rules/ramp.py): the steps on the campaign row, and the sending time the ramp
-- follows (migration 0024's trigger keeps sending_s and sending_since).

-- name: set_campaign_ramp
-- At create, in the transaction that inserted the draft: only a draft takes a ramp.
UPDATE campaigns SET ramp = %(ramp)s::jsonb, updated_at = now()
 WHERE id = %(id)s AND status = 'draft'
RETURNING id;

-- name: campaign_ramp
-- For `campaign status`: a read of one row; the sending time as of this statement.
SELECT ramp, rate_limit, status,
       sending_s + coalesce(extract(epoch FROM clock_timestamp() - sending_since)::float8, 0)
           AS sending_elapsed_s
  FROM campaigns WHERE id = %(id)s;
