-- Order events the mail service did not act on because they were older than
-- mail_event_max_age_s (the replay trap): a confirmation replayed after its age creates no
-- mail. Each one is recorded here, in the ingest transaction that advances the offsets past
-- it, so "why didn't I get my mail?" (`flashsend mail status KEY`) has an answer and an
-- operator sees how many arrived (`flashsend mail status`). Purged with the mail rows.
CREATE TABLE mail_stale_events (
    event_id    uuid        PRIMARY KEY,  -- a redelivered event is recorded once
    dedupe_key  text        NOT NULL,
    ref         text,
    event_type  text        NOT NULL,
    occurred_at timestamptz NOT NULL,
    age_s       double precision NOT NULL,  -- how old it was when it arrived
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX mail_stale_events_key ON mail_stale_events (dedupe_key);
CREATE INDEX mail_stale_events_recorded ON mail_stale_events (recorded_at);

-- A transactional mail to a suppressed address (hard bounce, complaint, manual block) ends
-- `suppressed`, apart from `failed` (SES refused it or the retries ran out), so the outcome
-- says what happened. Re-creating the CHECK scans `mail` under the migration's lock once.
ALTER TABLE mail DROP CONSTRAINT mail_status_check;
ALTER TABLE mail ADD CONSTRAINT mail_status_check
    CHECK (status IN ('pending', 'sending', 'sent', 'failed', 'unknown', 'cancelled',
                      'suppressed'));
