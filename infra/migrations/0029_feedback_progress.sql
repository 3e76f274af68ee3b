-- How far behind the feedback agent is, per partition of mail.events it owns: since when its
-- oldest event not yet applied has waited (NULL: nothing waits), as of `reported_at`. The
-- agent rewrites its partitions' rows twice a second; campaign workers read the oldest
-- `waiting_since` among fresh rows and hold their sends while it is too old
-- (streams/feedback_lag.py). A handful of rows: no index beyond the key.
CREATE TABLE IF NOT EXISTS feedback_progress (
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    waiting_since timestamptz,
    reported_at   timestamptz NOT NULL,
    PRIMARY KEY (topic, partition)
);
