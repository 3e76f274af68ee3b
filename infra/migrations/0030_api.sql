-- The Campaign HTTP API (flashsend/api/): its keys, the named audiences a request may use,
-- the answers kept for Idempotency-Key, and the audit log of every state change made by the
-- API or the command line.

-- Only the sha256 of a key is kept; `prefix` is its public part, shown by `api-key list` and
-- used to find the row (the hash is then compared in constant time).
CREATE TABLE api_keys (
    id          bigserial   PRIMARY KEY,
    name        text        NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9_.-]{1,64}$'),
    prefix      text        NOT NULL UNIQUE,
    key_hash    bytea       NOT NULL,
    role        text        NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    created_by  text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    revoked_at  timestamptz
);

-- An audience is SQL over users u, registered by an admin; a request names it, never sends
-- SQL.
CREATE TABLE audiences (
    name        text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.-]{1,64}$'),
    condition   text        NOT NULL,
    created_by  text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The first answer to a POST with an Idempotency-Key, per API key. A row without an answer
-- (status NULL) is a request still running: a retry waits for it.
CREATE TABLE idempotency_keys (
    api_key_id   bigint      NOT NULL REFERENCES api_keys (id),
    key          text        NOT NULL,
    request_hash bytea       NOT NULL,
    status       integer,
    body         jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (api_key_id, key)
);

-- Append-only: inserted in the transaction of the change it records; a trigger refuses any
-- UPDATE, DELETE or TRUNCATE, whoever runs it.
CREATE TABLE audit_log (
    id           bigserial   PRIMARY KEY,
    actor        text        NOT NULL,  -- an API key's name, or cli:<os user>
    action       text        NOT NULL,
    campaign_id  bigint,
    state_before text,
    state_after  text,
    request_id   text,
    source       text,                  -- the client's address (API), the host (CLI)
    detail       jsonb,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX audit_log_campaign ON audit_log (campaign_id, id);

CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER audit_log_no_update BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();
