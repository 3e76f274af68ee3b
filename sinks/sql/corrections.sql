-- Correction campaigns (producers/corrections.py).

-- name: correction_source
-- The campaign a correction is of, and where it stands. Read at create (it must have sent)
-- and again right before the correction's snapshot (it must not be sending any more).
SELECT id, status FROM campaigns WHERE id = %(id)s;

-- name: set_correction_of
-- At create, in the transaction that inserted the draft (as set_campaign_variants).
UPDATE campaigns SET correction_of = %(source)s, updated_at = now()
 WHERE id = %(id)s AND status = 'draft'
RETURNING id;

-- name: correction_of
SELECT correction_of FROM campaigns WHERE id = %(id)s;
