-- A pool of promo codes per campaign (`flashsend promo import|generate`). A code is free while
-- seq IS NULL and bound to the recipient (campaign_id, seq) for good once set; the claim binds
-- it in its own transaction (sinks/sql/promo.sql, bind_promo_codes).
--   PRIMARY KEY (campaign_id, code): a code exists once in a pool, so it is bound at most once.
--   promo_codes_recipient, UNIQUE: a recipient holds at most one code of its campaign.
--   promo_codes_free: the claim's scan for free codes, from a random slot on; a bound code
--   leaves it. Starting at a random slot, claims rarely meet on the same codes, and the
--   entries of codes bound since the last vacuum are spread over the index instead of
--   piling up in front of every scan.
-- campaigns.promo_pool: the claim binds codes for this campaign. Set by the first import or
-- generate, only while the campaign is a draft, and never unset: workers may cache it once the
-- campaign has started.
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS promo_pool boolean NOT NULL DEFAULT false;

CREATE TABLE promo_codes (
    campaign_id bigint      NOT NULL REFERENCES campaigns (id),
    code        text        NOT NULL CHECK (length(code) BETWEEN 1 AND 64),
    seq         integer,    -- the recipient it is bound to; NULL while free
    slot        integer     NOT NULL DEFAULT (random() * 2147483647)::integer,
    bound_at    timestamptz,
    PRIMARY KEY (campaign_id, code)
);
CREATE UNIQUE INDEX promo_codes_recipient ON promo_codes (campaign_id, seq) WHERE seq IS NOT NULL;
CREATE INDEX promo_codes_free ON promo_codes (campaign_id, slot) WHERE seq IS NULL;
