-- Two facts about a user's address, computed when the row is written instead of once per user
-- in every campaign's snapshot (producers/campaign.snapshot):
--   email_key  the normalised address (streams.addresses.normalise_email: stripped,
--              lowercased) that the suppression table is keyed by;
--   email_ok   the snapshot's coarse validity check. The sender checks every address again
--              with streams.addresses.is_valid_email before it goes to SES; this one only
--              keeps plainly broken addresses out of the campaign (skipped, invalid_email).
--              No bounded repetition ({1,64} made PostgreSQL's regex engine 8x slower):
--              strpos bounds the local part instead.
-- Measured on the bench's 1M users (docs/decisions.md): computing both in the snapshot cost
-- ~0.65 s of its ~2.3 s (lower/btrim 0.18 s, the regex 0.37 s, strpos/length 0.1 s), and the
-- anti-join on a computed key could not use the plain column. Both are STORED generated
-- columns, so they follow every change of `email` and no writer has to know about them.
-- Adding them rewrites the table under an ACCESS EXCLUSIVE lock (seconds per million users):
-- apply this migration outside a send window.
ALTER TABLE users
    ADD COLUMN email_key text GENERATED ALWAYS AS (lower(btrim(email))) STORED,
    ADD COLUMN email_ok boolean GENERATED ALWAYS AS (
        email ~ '^[^@[:space:]]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$'
        AND strpos(email, '@') <= 65 AND length(email) <= 254
    ) STORED;
