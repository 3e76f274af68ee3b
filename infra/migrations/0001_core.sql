-- Core schema: users, suppressions, campaigns, recipients, and the Kafka offset store.
-- PostgreSQL is the source of truth; Kafka messages only say "look at this row".

CREATE TABLE users (
    id               bigint PRIMARY KEY,
    email            text        NOT NULL,
    status           text        NOT NULL DEFAULT 'active',   -- active | inactive | banned
    marketing_opt_in boolean     NOT NULL DEFAULT true,
    first_name       text,
    locale           text        NOT NULL DEFAULT 'en',
    created_at       timestamptz NOT NULL DEFAULT now(),
    opted_out_at     timestamptz
);

-- Addresses we must never mail again (hard bounce, complaint, unsubscribe, manual).
-- Keyed by the normalised address (streams.addresses.normalise_email).
CREATE TABLE email_suppressions (
    email        text PRIMARY KEY,
    reason       text        NOT NULL,
    source_event text,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE campaigns (
    id                 bigserial PRIMARY KEY,
    name               text             NOT NULL,
    template           text             NOT NULL,
    from_address       text             NOT NULL,
    configuration_set  text,
    rate_limit         double precision NOT NULL DEFAULT 600,  -- recipients/s, 0 = unlimited
    audience_condition text             NOT NULL,
    status             text             NOT NULL DEFAULT 'draft'
        CHECK (status IN ('draft', 'snapshotting', 'sending', 'paused', 'cancelled', 'done', 'failed')),
    reason             text,
    recipients         integer,
    created_at         timestamptz      NOT NULL DEFAULT now(),
    started_at         timestamptz,
    snapshot_done_at   timestamptz,
    produced_at        timestamptz,
    paused_at          timestamptz,
    finished_at        timestamptz,
    updated_at         timestamptz      NOT NULL DEFAULT now()
);

-- One row per recipient of a campaign, written once by the snapshot, then updated twice
-- (pending -> sending -> sent). Deliberately NO index on status: an index on an updated
-- column defeats HOT updates and roughly doubles write time (seed trap 5). fillfactor leaves
-- room on each page for the HOT copies.
CREATE TABLE campaign_recipients (
    campaign_id bigint      NOT NULL REFERENCES campaigns (id),
    seq         integer     NOT NULL,            -- dense 1..N within the campaign
    user_id     bigint      NOT NULL,
    email       text        NOT NULL,
    status      text        NOT NULL DEFAULT 'pending',
    -- pending | sending | sent | failed | unknown | skipped | cancelled
    attempts    smallint    NOT NULL DEFAULT 0,
    claimed_at  timestamptz,
    sent_at     timestamptz,
    reason      text,
    message_id  text,
    requeue     boolean     NOT NULL DEFAULT false, -- pending again with no message carrying it
    PRIMARY KEY (campaign_id, seq),
    UNIQUE (campaign_id, user_id)
) WITH (fillfactor = 70);

-- Consumer offsets stored with the effects ("store offsets with the output"): advanced in the
-- same transaction as the claim, guarded by a monotonic fence (next_offset <= first offset).
CREATE TABLE kafka_offsets (
    group_id    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    next_offset bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);
