-- Seed list first, and correction campaigns (streams/seed_list.py, sinks/seed_store.py).
-- A seed address is a recipient row of the campaign with a synthetic user id below zero
-- (-1, -2, … in the list's order): no users row exists for it, real user ids are positive,
-- and the (campaign_id, user_id) unique index finds a campaign's seeds without a scan. While
-- the hold lasts the audience's rows are `held` (the A/B holdout's status); the release makes
-- them pending in one guarded statement (sinks/sql/seeds.sql, release_hold).
-- All columns are nullable without a default: adding them rewrites nothing.
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS seed_recipients integer;
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS hold_s double precision;
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS hold_until timestamptz;
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS hold_released_at timestamptz;
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS hold_released_by text;
-- A correction campaign's audience is the users campaign `correction_of` sent to; the
-- condition itself is in audience_condition, this column is what status and report show.
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS correction_of bigint REFERENCES campaigns (id);
