-- name: campaign_channel
-- Which channel a campaign sends on (fixed at creation): picks its snapshot statement.
SELECT channel FROM campaigns WHERE id = %(id)s;

-- name: snapshot_sms_recipients
-- snapshot_recipients for an SMS campaign, in the same transaction and under the same lock
-- (the campaign row moved out of draft), so no ON CONFLICT either. The address kept is the
-- user's normalised number (separators ` ().-` removed, a `00` prefix written `+`: the twin of
-- streams.rules.phones.normalise_phone), valid when E.164 (the twin of phone_problem). One message
-- per number: of the audience's users sharing a number, the lowest id with a valid number is
-- pending, the others are skipped, 'duplicate_address'; invalid or missing numbers are
-- skipped, 'invalid_phone' (stored as '' when missing). Numbers in the suppression table (SMS
-- opt-outs, keyed by the normalised number) are left out, as suppressed addresses are for
-- email. {audience} and {partition} as in snapshot_recipients (braces doubled).
-- Quiet hours (streams/rules/send_plan.sms_schedule): with a local window (zone_names non-NULL) each
-- row takes its zone's send_after and send_before (the end of that window, the deadline the
-- sender checks before each text); a row due later than %(now)s is `held` in its slot, a zone
-- whose window of --date has passed is skipped 'window_passed', as for email; {order} is then
-- "a.send_after, a.id", so each slot is a contiguous seq range.
INSERT INTO {partition} (campaign_id, seq, user_id, email, status, reason, send_after, send_before)
SELECT %(campaign_id)s, row_number() OVER (ORDER BY {order}), a.id, coalesce(a.phone_key, ''),
       CASE WHEN NOT (a.phone_ok AND a.nth = 1) THEN 'skipped'
            WHEN a.send_after = 'infinity' THEN 'skipped'
            WHEN a.send_after > %(now)s::timestamptz THEN 'held'
            ELSE 'pending' END,
       CASE WHEN NOT a.phone_ok THEN 'invalid_phone'
            WHEN a.nth > 1 THEN 'duplicate_address'
            WHEN a.send_after = 'infinity' THEN 'window_passed' END,
       CASE WHEN a.send_after < 'infinity' THEN a.send_after END,
       CASE WHEN a.send_before < 'infinity' THEN a.send_before END
  FROM (SELECT p.id, p.phone_key, p.phone_ok, p.send_after, p.send_before,
               row_number() OVER (PARTITION BY p.phone_key ORDER BY p.phone_ok DESC, p.id) AS nth
          FROM (SELECT u.id, k.phone_key,
                       coalesce(k.phone_key ~ '^\+[1-9][0-9]{{7,14}}$', false) AS phone_ok,
                       (%(zone_at)s::timestamptz[])[z.n] AS send_after,
                       (%(zone_until)s::timestamptz[])[z.n] AS send_before
                  FROM users u
                 CROSS JOIN LATERAL (
                       SELECT regexp_replace(regexp_replace(u.phone, '[ ().-]', '', 'g'),
                                             '^00', '+') AS phone_key) k
                 CROSS JOIN LATERAL (
                       SELECT coalesce(array_position(%(zone_names)s::text[],
                                                      coalesce(u.timezone, '')), 1) AS n) z
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
