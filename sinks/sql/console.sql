-- The operator console's sessions (migration 0033; sinks/console_session_store.py).

-- name: insert_console_session
-- token_hash is UNIQUE and 256 random bits: two sign-ins never share a row.
INSERT INTO console_sessions (token_hash, csrf_token, api_key_id, expires_at)
VALUES (%(token_hash)s, %(csrf_token)s, %(api_key_id)s, now() + make_interval(secs => %(ttl_s)s))
RETURNING id, expires_at;

-- name: console_session_by_token
-- Read on every request with the key it acts for: an expiry, a sign-out or the key's revoke
-- or expiry counts from the next request. Only usable sessions are returned.
SELECT s.id, s.csrf_token, s.expires_at, k.id AS api_key_id, k.name, k.role
  FROM console_sessions s JOIN api_keys k ON k.id = s.api_key_id
 WHERE s.token_hash = %(token_hash)s
   AND s.ended_at IS NULL AND s.expires_at > now()
   AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now());

-- name: end_console_session
-- Sign-out; compare-and-set on ended_at, so signing out twice ends it once.
UPDATE console_sessions SET ended_at = now()
 WHERE token_hash = %(token_hash)s AND ended_at IS NULL
RETURNING id;

-- name: delete_old_console_sessions
-- Housekeeping at sign-in: rows a day past their end are of no use to anyone.
DELETE FROM console_sessions
 WHERE coalesce(ended_at, expires_at) < now() - interval '1 day';

-- name: console_campaign_feedback
-- The SES events counted for a campaign (the auto-pause's inputs); one row, no lock.
SELECT sent, delivered, bounced, complained FROM campaign_feedback WHERE campaign_id = %(id)s;
