-- The Campaign HTTP API's keys, audiences and idempotency records, and the audit log
-- (migration 0030; sinks/api_key_store.py, sinks/audit_store.py).

-- name: insert_api_key
-- name and prefix are UNIQUE: two creates of one name race on the index, the second fails.
INSERT INTO api_keys (name, prefix, key_hash, role, created_by, expires_at)
VALUES (%(name)s, %(prefix)s, %(key_hash)s, %(role)s, %(created_by)s, %(expires_at)s)
RETURNING id, created_at;

-- name: api_key_by_prefix
-- Read on every request, so a revoke or an expiry counts from the next one.
SELECT id, name, key_hash, role, expires_at, revoked_at, expires_at IS NOT NULL
       AND expires_at <= now() AS expired
  FROM api_keys WHERE prefix = %(prefix)s;

-- name: api_key_usable
-- Asked again while an event stream stays open, so a revoke or an expiry ends it too.
SELECT revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
  FROM api_keys WHERE id = %(id)s;

-- name: list_api_keys
SELECT id, name, prefix, role, created_by, created_at, expires_at, revoked_at
  FROM api_keys ORDER BY id;

-- name: revoke_api_key
-- Compare-and-set on revoked_at: revoking twice revokes once (the second finds no row).
UPDATE api_keys SET revoked_at = now()
 WHERE (name = %(who)s OR prefix = %(who)s) AND revoked_at IS NULL
RETURNING id, name, prefix;

-- name: insert_audience
-- The name is the primary key: registering it twice at once, the second fails.
INSERT INTO audiences (name, condition, created_by) VALUES (%(name)s, %(condition)s, %(by)s)
RETURNING created_at;

-- name: audience_by_name
SELECT name, condition, created_by, created_at FROM audiences WHERE name = %(name)s;

-- name: list_audiences
SELECT name, condition, created_by, created_at FROM audiences ORDER BY name;

-- name: claim_idempotency_key
-- The primary key (api key, Idempotency-Key) is the claim: of two requests with one key
-- the second inserts nothing and reads the first one's row (claimed_idempotency_key).
INSERT INTO idempotency_keys (api_key_id, key, request_hash)
VALUES (%(api_key_id)s, %(key)s, %(request_hash)s)
ON CONFLICT DO NOTHING
RETURNING key;

-- name: claimed_idempotency_key
SELECT request_hash, status, body FROM idempotency_keys
 WHERE api_key_id = %(api_key_id)s AND key = %(key)s;

-- name: take_over_idempotency_key
-- A claim left unanswered longer than %(stale_s)s seconds belongs to a request whose process
-- died: a retry of the same request takes it over. The compare-and-set on created_at lets one
-- retry do so; the others find a fresh claim and wait for its answer.
UPDATE idempotency_keys SET created_at = now()
 WHERE api_key_id = %(api_key_id)s AND key = %(key)s AND status IS NULL
   AND request_hash = %(request_hash)s
   AND created_at < now() - make_interval(secs => %(stale_s)s)
RETURNING key;

-- name: answer_idempotency_key
-- Only the request that claimed the key answers it (status IS NULL until then).
UPDATE idempotency_keys SET status = %(status)s, body = %(body)s
 WHERE api_key_id = %(api_key_id)s AND key = %(key)s AND status IS NULL;

-- name: drop_idempotency_key
-- A request that failed on our side (5xx) gives its key back, so a retry runs again.
DELETE FROM idempotency_keys
 WHERE api_key_id = %(api_key_id)s AND key = %(key)s AND status IS NULL;

-- name: lock_campaign_status
-- In the transaction of a transition, before its guarded UPDATE: the row lock orders the
-- campaign's transitions, so the state read here is the one the UPDATE changes, and the
-- audit rows of one campaign are numbered in the order their changes commit.
SELECT status FROM campaigns WHERE id = %(id)s FOR UPDATE;

-- name: insert_audit
-- Insert only (a trigger refuses UPDATE and DELETE), in the transaction of the change.
INSERT INTO audit_log (actor, action, campaign_id, state_before, state_after, request_id,
                       source, detail)
VALUES (%(actor)s, %(action)s, %(campaign_id)s, %(state_before)s, %(state_after)s,
        %(request_id)s, %(source)s, %(detail)s)
RETURNING id;

-- name: list_audit
-- Newest first; keyset pagination on id (before_id NULL: from the newest).
SELECT id, actor, action, campaign_id, state_before, state_after, request_id, source, detail,
       created_at
  FROM audit_log
 WHERE (%(campaign_id)s::bigint IS NULL OR campaign_id = %(campaign_id)s)
   AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: list_campaigns
-- Newest first, keyset pagination on id; reads the campaign rows only (a small table).
SELECT id, name, status, reason, channel, rate_limit, recipients, created_at, started_at,
       finished_at
  FROM campaigns
 WHERE (%(status)s::text IS NULL OR status = %(status)s)
   AND (%(channel)s::text IS NULL OR channel = %(channel)s)
   AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s)
 ORDER BY id DESC
 LIMIT %(limit)s;
