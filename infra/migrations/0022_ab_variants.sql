-- A/B test, then the winner (streams/ab_test.py). A campaign's variants are a small jsonb
-- list on its row ([{"name", "template", "percent"}], NULL = no test). Each recipient's
-- variant is stored at snapshot; the holdout's rows are `held` (variant NULL) until a winner
-- is set, then `pending` with the winner's name (sinks/sql/variants.sql, set_winner).
-- The new recipient column is nullable without a default: adding it rewrites no partition.
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS variants jsonb;
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS holdout_wait_s double precision;
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS winner_by text
    CHECK (winner_by IN ('clicks', 'opens', 'manual'));
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS winner text;
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS winner_at timestamptz;
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS winner_reason text;
ALTER TABLE campaign_recipients ADD COLUMN IF NOT EXISTS variant text;

-- Unique SES events per (campaign, variant), from the `variant` message tag, written by the
-- feedback agent in the transaction of its batch (apply_feedback): an event counts once
-- (feedback_seen), and an Open or Click event id is per message and recipient, so repeated
-- opens of one mail count once.
CREATE TABLE IF NOT EXISTS campaign_variant_feedback (
    campaign_id bigint NOT NULL,
    variant     text   NOT NULL,
    delivered   bigint NOT NULL DEFAULT 0,
    bounced     bigint NOT NULL DEFAULT 0,
    complained  bigint NOT NULL DEFAULT 0,
    opened      bigint NOT NULL DEFAULT 0,
    clicked     bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (campaign_id, variant)
);
