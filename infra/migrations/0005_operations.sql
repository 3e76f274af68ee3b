-- Operations: every offset reset (replay) and every dead letter put back on its
-- topic is recorded here — who, when, why, and what the plan said — so "why did this mail go
-- out again?" is answered by a query, not by memory. Rows are only ever inserted.

-- One row per partition of a replay; a replay's rows share replay_id and are written in the
-- same transaction as the offsets they describe (docs/runbooks/replay.md).
CREATE TABLE offset_resets (
    id            bigserial   PRIMARY KEY,
    replay_id     uuid        NOT NULL,
    requested_by  text        NOT NULL,
    host          text        NOT NULL,
    reason        text        NOT NULL,
    group_id      text        NOT NULL,   -- the offset store's group (kafka_offsets.group_id)
    broker_group  text        NOT NULL,   -- the Kafka consumer group whose commits were reset
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    from_offset   bigint      NOT NULL,
    to_offset     bigint      NOT NULL,
    records       bigint      NOT NULL,   -- records between the two offsets
    would_send    bigint      NOT NULL,   -- of those, how many the plan said would be mailed
    deduplicated  bigint      NOT NULL,   -- ... would find their row done (no mail)
    forced        boolean     NOT NULL DEFAULT false,  -- --i-understand overrode a refusal
    plan          jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX offset_resets_target ON offset_resets (group_id, topic, created_at);

-- One row per dead letter produced back to its original topic (`flashsend dlq replay`).
CREATE TABLE dlq_replays (
    id               bigserial   PRIMARY KEY,
    replay_id        uuid        NOT NULL,
    requested_by     text        NOT NULL,
    host             text        NOT NULL,
    reason           text        NOT NULL,
    dlq_topic        text        NOT NULL,
    dlq_partition    integer     NOT NULL,
    dlq_offset       bigint      NOT NULL,
    dead_reason      text        NOT NULL,   -- why it was dead-lettered (flashsend.reason)
    target_topic     text        NOT NULL,
    target_partition integer     NOT NULL,
    original_offset  bigint      NOT NULL,
    new_offset       bigint      NOT NULL,   -- where the replayed copy landed
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dlq_replays_letter ON dlq_replays (dlq_topic, dlq_partition, dlq_offset);
