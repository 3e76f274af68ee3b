-- When a reconciler last scanned a campaign's rows for expired leases (expire_leases). The
-- scan reads every row of the campaign (no index says which rows are 'sending': one would
-- make every claim and result a non-HOT update), so it runs once per quarter lease per
-- campaign, whichever worker's tick comes first, not once per worker.
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS leases_checked_at timestamptz;
