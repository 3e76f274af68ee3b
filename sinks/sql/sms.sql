-- name: campaign_channel
-- Which channel a campaign sends on (fixed at creation): picks its snapshot statement.
SELECT channel FROM campaigns WHERE id = %(id)s;

-- name: snapshot_sms_recipients
-- snapshot_recipients for an SMS campaign, in the same transaction and under the same lock
-- (the campaign row moved out of draft), so no ON CONFLICT either. The address kept is the
-- user's normalised number (separators ` ().-` removed, a `00` prefix written `+`: the twin of
-- streams.phones.normalise_phone), valid when E.164 (the twin of phone_problem). One message
-- per number: of the audience's users sharing a number, the lowest id with a valid number is
-- pending, the others are skipped, 'duplicate_address'; invalid or missing numbers are
-- skipped, 'invalid_phone' (stored as '' when missing). Numbers in the suppression table (SMS
-- opt-outs, keyed by the normalised number) are left out, as suppressed addresses are for
-- email. {audience} and {partition} as in snapshot_recipients (braces doubled).
INSERT INTO {partition} (campaign_id, seq, user_id, email, status, reason)
SELECT %(campaign_id)s, row_number() OVER (ORDER BY a.id), a.id, coalesce(a.phone_key, ''),
       CASE WHEN a.phone_ok AND a.nth = 1 THEN 'pending' ELSE 'skipped' END,
       CASE WHEN NOT a.phone_ok THEN 'invalid_phone'
            WHEN a.nth > 1 THEN 'duplicate_address' END
  FROM (SELECT p.id, p.phone_key, p.phone_ok,
               row_number() OVER (PARTITION BY p.phone_key ORDER BY p.phone_ok DESC, p.id) AS nth
          FROM (SELECT u.id, k.phone_key,
                       coalesce(k.phone_key ~ '^\+[1-9][0-9]{{7,14}}$', false) AS phone_ok
                  FROM users u
                 CROSS JOIN LATERAL (
                       SELECT regexp_replace(regexp_replace(u.phone, '[ ().-]', '', 'g'),
                                             '^00', '+') AS phone_key) k
                 WHERE ({audience})
                   AND NOT EXISTS (SELECT 1 FROM email_suppressions s
                                    WHERE s.email = k.phone_key)) p) a;

-- name: suppress_opted_out_numbers
-- The provider's opt-out list into the suppression table, keyed by the normalised number. ON
-- CONFLICT DO NOTHING: a number already suppressed (an earlier sync, a STOP event) keeps its
-- first reason; two syncs at once insert each number once.
INSERT INTO email_suppressions (email, reason, source_event)
SELECT n, 'sms_opt_out', 'opt_out_list' FROM unnest(%(numbers)s::text[]) AS n
ON CONFLICT (email) DO NOTHING;
