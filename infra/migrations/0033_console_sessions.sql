-- The operator console's sessions (flashsend/api/console/): signing in with an API key makes
-- one; the browser holds the token in an HttpOnly cookie, the table only its sha256. A
-- session acts with its key's name and role, read with the key on every request, so revoking
-- the key ends its sessions too. `expires_at` is absolute: using a session does not extend it.
CREATE TABLE console_sessions (
    id          bigserial   PRIMARY KEY,
    token_hash  bytea       NOT NULL UNIQUE,
    csrf_token  text        NOT NULL,
    api_key_id  bigint      NOT NULL REFERENCES api_keys (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    ended_at    timestamptz
);
CREATE INDEX console_sessions_expires ON console_sessions (expires_at);
