-- The demo order service's own database: orders, its outbox, and what it learnt about the
-- mails of each order from the mail service's lifecycle events.
-- Numbered 0101 (not 0001) so the same file can also be applied to flashsend's database for
-- the monolith mode without colliding in schema_migrations with infra/migrations/0001.

CREATE TABLE orders (
    id            bigserial   PRIMARY KEY,
    email         text        NOT NULL,
    customer_name text,
    locale        text        NOT NULL DEFAULT 'en',
    total         numeric(14, 2) NOT NULL DEFAULT 0,
    currency      text        NOT NULL DEFAULT 'VND',
    items         jsonb       NOT NULL DEFAULT '[]',
    status        text        NOT NULL DEFAULT 'confirmed'
        CHECK (status IN ('confirmed', 'cancelled')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    cancelled_at  timestamptz
);

-- Events to publish, written in the same transaction as the order change. event_id is made
-- here, at write time (seed architecture-2 trap 2): a relay that publishes a row twice
-- publishes the same id twice.
CREATE TABLE outbox (
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
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL AND dead_at IS NULL;

-- The order service's view of each mail, fed by mail.events. status_at is the occurred_at of
-- the event that set `status`: an older event arriving later changes nothing.
CREATE TABLE order_emails (
    dedupe_key     text        PRIMARY KEY,
    order_id       bigint      NOT NULL,
    status         text        NOT NULL,   -- sent | failed | unknown | cancelled
    status_at      timestamptz NOT NULL,
    message_id     text,
    reason         text,
    cancel_outcome text,                   -- cancelled | too_late (set by the cancel events)
    cancel_at      timestamptz,
    last_event_id  uuid        NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX order_emails_order ON order_emails (order_id);
