-- Transactional mail: the mail service's tables, in flashsend's own database (the
-- mail platform's database; the order service has its own, see infra/migrations_orders/).
-- A row in `mail` is the source of truth for one email; Kafka and NOTIFY are only doorbells.

CREATE TABLE mail (
    id               bigserial   PRIMARY KEY,
    -- The order event that created the row. NULL for tombstones (a cancel that arrived before
    -- the create: one cancel may tombstone several keys, so it cannot own a UNIQUE id) and for
    -- rows written by the monolith library call enqueue_mail(). UNIQUE allows many NULLs.
    event_id         uuid        UNIQUE,
    -- The business intent ('order-confirmed:42'). UNIQUE: a second event for the same intent,
    -- a redelivery with another event_id, or a create after a tombstone inserts nothing.
    dedupe_key       text        NOT NULL UNIQUE,
    ref              text,                        -- business reference (order id): cancel by order
    to_email         text,                        -- NULL only for tombstones
    template         text,
    data             jsonb       NOT NULL DEFAULT '{}',
    delivery         text        NOT NULL DEFAULT 'at_least_once'
        CHECK (delivery IN ('at_least_once', 'at_most_once')),
    status           text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'sending', 'sent', 'failed', 'unknown', 'cancelled')),
    cancel_requested boolean     NOT NULL DEFAULT false,  -- stops retries of a row in flight
    cancel_event_id  uuid,                                -- not UNIQUE (seed cancel trap 2)
    attempts         integer     NOT NULL DEFAULT 0,      -- claims so far = the fencing token
    send_errors      integer     NOT NULL DEFAULT 0,      -- explicit failures (retry budget)
    locked_until     timestamptz,                         -- the lease of the current claim
    send_after       timestamptz NOT NULL DEFAULT now(),  -- delayed mail is a column
    provider_id      text,                                -- SES MessageId
    last_error       text,
    occurred_at      timestamptz,                         -- business time of the creating event
    created_at       timestamptz NOT NULL DEFAULT now(),
    claimed_at       timestamptz,
    sent_at          timestamptz,
    cancelled_at     timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CHECK (status = 'cancelled' OR (to_email IS NOT NULL AND template IS NOT NULL))
);

-- Only rows with work left are indexed: the index stays small however large `mail` grows
-- (seed architecture-1 trap 9), and the sender's claim is an index range scan.
CREATE INDEX mail_todo ON mail (send_after, id) WHERE status IN ('pending', 'sending');
CREATE INDEX mail_ref ON mail (ref) WHERE ref IS NOT NULL;
-- Purge of terminal rows older than the retention horizon, oldest first.
CREATE INDEX mail_created ON mail (created_at);

-- The mail service's own outbox: lifecycle events (EmailSent, EmailFailed, EmailCancelled,
-- EmailCancelTooLate) are written in the same transaction as the state change they report,
-- and published to mail.events by the outbox relay (producers/outbox_relay.py). Same shape as
-- the order service's `outbox`.
CREATE TABLE mail_outbox (
    id           bigserial   PRIMARY KEY,
    event_id     uuid        NOT NULL DEFAULT uuidv7() UNIQUE,  -- generated at write time
    topic        text        NOT NULL,
    msg_key      text        NOT NULL,
    schema_name  text        NOT NULL,
    event_type   text        NOT NULL,
    version      integer     NOT NULL DEFAULT 1,
    dedupe_key   text        NOT NULL,
    payload      jsonb       NOT NULL,
    occurred_at  timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    attempts     integer     NOT NULL DEFAULT 0,   -- message-specific publish failures
    last_error   text,
    dead_at      timestamptz
);
CREATE INDEX mail_outbox_unpublished ON mail_outbox (id)
    WHERE published_at IS NULL AND dead_at IS NULL;
