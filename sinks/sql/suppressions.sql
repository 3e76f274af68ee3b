-- The suppression list as an admin sees and edits it (sinks/suppression_store.py). The
-- sender and the feedback agent key it by the normalised address (lower(btrim(email))).

-- name: list_suppressions
-- Keyset pages in address order over the primary key: `after` is the last address of the
-- page before; `address`, when given, is one exact normalised address.
SELECT email, reason, source_event, created_at
  FROM email_suppressions
 WHERE (%(address)s::text IS NULL OR email = %(address)s)
   AND (%(after)s::text IS NULL OR email > %(after)s)
 ORDER BY email
 LIMIT %(limit)s;

-- name: add_suppression
-- The primary key makes adding twice (or racing the feedback agent) add once: the second
-- inserts nothing and the caller reports the row that is there.
INSERT INTO email_suppressions (email, reason, source_event)
VALUES (%(address)s, %(reason)s, %(source)s)
ON CONFLICT (email) DO NOTHING
RETURNING email, reason, created_at;

-- name: remove_suppression
-- One statement: the row that was there (its reason goes to the audit log), or nothing.
DELETE FROM email_suppressions WHERE email = %(address)s
RETURNING email, reason, source_event, created_at;
