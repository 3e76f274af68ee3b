-- Scheduled sending (streams/send_plan.py): a local-time window or engagement waves.
-- A campaign's plan is a small jsonb on its row (NULL = send everything at start). At snapshot
-- each recipient gets send_after; rows not yet due are `held` and numbered after the due ones,
-- by (send_after, user id), so each slot (one send_after) is a contiguous seq range kept in
-- campaign_slots. The scheduler releases due slots (sinks/sql/schedule.sql).
-- Every new column is nullable without a default: adding it rewrites no table or partition.
ALTER TABLE users ADD COLUMN IF NOT EXISTS timezone text;  -- IANA name; NULL: the default zone
ALTER TABLE users ADD COLUMN IF NOT EXISTS last_open_at timestamptz;
ALTER TABLE users ADD COLUMN IF NOT EXISTS last_click_at timestamptz;
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS schedule jsonb;
ALTER TABLE campaign_recipients ADD COLUMN IF NOT EXISTS send_after timestamptz;

-- One row per distinct send_after of a scheduled campaign, written by the snapshot. The
-- scheduler's tick reads only this table (a few hundred rows at most per campaign).
CREATE TABLE IF NOT EXISTS campaign_slots (
    campaign_id bigint      NOT NULL REFERENCES campaigns (id),
    slot_at     timestamptz NOT NULL,
    first_seq   integer     NOT NULL,
    last_seq    integer     NOT NULL,
    recipients  integer     NOT NULL,
    released_at timestamptz,           -- NULL: not yet due (its rows are held)
    PRIMARY KEY (campaign_id, slot_at)
);
