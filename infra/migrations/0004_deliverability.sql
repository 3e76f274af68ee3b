-- Deliverability: what SES tells us after sending, and one-click unsubscribes.
-- email_suppressions (0001) is the list the sender re-checks before every batch; these tables
-- feed it and decide when a campaign must stop by itself.

-- Feedback counters per campaign, from SES events (simulator addresses excluded, as SES
-- excludes them from its own reputation metrics). One row per campaign, updated by the feedback
-- agent in the transaction that advances its offsets. The window_* columns hold the counters
-- at the last automatic pause: rates are judged on what happened since, so a campaign an
-- operator resumes after narrowing its audience is not paused again by the old complaints.
CREATE TABLE campaign_feedback (
    campaign_id       bigint      PRIMARY KEY REFERENCES campaigns (id),
    sent              bigint      NOT NULL DEFAULT 0,  -- Send events
    delivered         bigint      NOT NULL DEFAULT 0,
    bounced           bigint      NOT NULL DEFAULT 0,  -- Permanent (hard) bounces
    soft_bounced      bigint      NOT NULL DEFAULT 0,  -- Transient / Undetermined
    complained        bigint      NOT NULL DEFAULT 0,
    rejected          bigint      NOT NULL DEFAULT 0,
    delayed           bigint      NOT NULL DEFAULT 0,
    rendering_failed  bigint      NOT NULL DEFAULT 0,
    unsubscribed      bigint      NOT NULL DEFAULT 0,  -- one-click unsubscribes from its mail
    window_sent       bigint      NOT NULL DEFAULT 0,
    window_delivered  bigint      NOT NULL DEFAULT 0,
    window_bounced    bigint      NOT NULL DEFAULT 0,
    window_complained bigint      NOT NULL DEFAULT 0,
    auto_paused_at    timestamptz,
    auto_pause_reason text,
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- Events already applied, by their deterministic id (uuid5 of SES message id, event type and
-- recipient; the outbox event_id for unsubscribes). SNS delivers at least once and may POST the
-- same event twice; the webhook then publishes it twice: this table makes counters exact.
-- Purged after feedback_dedupe_retention_s, which must outlive the topic's retention.
CREATE TABLE feedback_seen (
    event_id uuid        PRIMARY KEY,
    seen_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX feedback_seen_at ON feedback_seen (seen_at);

-- The webhook's outbox: an `Unsubscribed` event is written in the same statement as the
-- opt-out, so the unsubscribe never depends on Kafka being up, and the event is never lost.
-- Same shape as mail_outbox (0003), published by the same relay (producers/outbox_relay.py).
CREATE TABLE feedback_outbox (
    id           bigserial   PRIMARY KEY,
    event_id     uuid        NOT NULL DEFAULT uuidv7() UNIQUE,
    topic        text        NOT NULL,
    msg_key      text        NOT NULL,
    schema_name  text        NOT NULL,
    event_type   text        NOT NULL,
    version      integer     NOT NULL DEFAULT 1,
    dedupe_key   text        NOT NULL,
    payload      jsonb       NOT NULL,
    occurred_at  timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    dead_at      timestamptz
);
CREATE INDEX feedback_outbox_unpublished ON feedback_outbox (id)
    WHERE published_at IS NULL AND dead_at IS NULL;
