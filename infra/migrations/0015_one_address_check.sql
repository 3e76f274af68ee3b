-- One validity check for an address, the snapshot's and the sender's alike.
--
-- users.email_ok (migration 0012) was a coarse regex that let through what the sender's
-- streams.addresses.is_valid_email refuses, and what SES refuses for a whole bulk call:
-- `"quoted"@x.com`, `a..b@x.com`, `.a@x.com`, a 64-character label, `a@1.2.3.4`. It now says
-- exactly what is_valid_email says (tests/integration/test_address_check.py compares the two on
-- a hostile list and on random strings): an ASCII dot-atom local part of at most 64 characters,
-- a domain of two or more LDH labels of at most 63 characters, none starting or ending with a
-- hyphen, whose last label is alphabetic and at least two long or an IDN in punycode (xn--),
-- at most 254 characters in all. No space or control character anywhere: an address with
-- surrounding spaces is invalid as stored (fix the user row), as the sender would refuse it.
-- Still no bounded repetition in the regex ({1,64} made PostgreSQL's regex engine 8x slower):
-- strpos bounds the local part, the second regex the labels, length() the whole.
-- Rewrites users under an ACCESS EXCLUSIVE lock (seconds per million users): apply it outside
-- a send window.
ALTER TABLE users ALTER COLUMN email_ok SET EXPRESSION AS (
    -- dot-atom local part @ labels . last label (letters, or xn-- punycode); adjacent
    -- literals on separate lines are one string in SQL
    email ~ ('^[A-Za-z0-9!#$%&''*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&''*+/=?^_`{|}~-]+)*'
             '@([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?\.)+'
             '([A-Za-z][A-Za-z]+|[Xx][Nn]--[A-Za-z0-9-]*[A-Za-z0-9])$')
    AND strpos(email, '@') <= 65
    AND length(email) <= 254
    AND split_part(email, '@', 2) !~ '[^.]{64}'
);

-- What the snapshot set aside, for `campaign status` (the rows say it too, by reason, for
-- `campaign report`): users whose normalised address (users.email_key) a lower user id of the
-- same audience already has, and users whose address fails the check above. NULL for a
-- campaign snapshotted before this migration.
ALTER TABLE campaigns
    ADD COLUMN duplicate_addresses integer,
    ADD COLUMN invalid_addresses integer;
