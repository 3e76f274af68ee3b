-- Push campaigns (streams/push_channel.py): the snapshot, the endpoints a call publishes to,
-- and what a publish learns about an endpoint.

-- name: snapshot_push_recipients
-- snapshot_recipients for a push campaign, in the same transaction and under the same lock
-- (the campaign row moved out of draft), so no ON CONFLICT either. One row per audience user
-- whatever their number of devices; the address kept is the ids of the user's endpoints (at
-- most %(max_devices)s of each kind, the most recently seen), comma-separated, a disabled
-- one's prefixed `d` (streams/rules/push_message.endpoint_ids): the lanes charge a row one unit of
-- the rate per enabled endpoint (streams/push_channel.row_publishes), the channel publishes
-- to each of them once and names each disabled one in the row's reason. A user who turned
-- push off is skipped, 'push_opted_out'; one without an endpoint 'no_device'; one whose
-- endpoints are all disabled 'endpoint_disabled:<reason>'. Quiet hours as for SMS
-- (snapshot_sms_recipients): zone_names/zone_at/zone_until give each row its local window's
-- send_after and send_before; {order} as there. {audience} and {partition} as in
-- snapshot_recipients (braces doubled).
INSERT INTO {partition} (campaign_id, seq, user_id, email, status, reason, send_after, send_before)
SELECT %(campaign_id)s, row_number() OVER (ORDER BY {order}), a.id, coalesce(a.endpoint_ids, ''),
       CASE WHEN a.push_opt_out OR NOT coalesce(a.any_enabled, false) THEN 'skipped'
            WHEN a.send_after = 'infinity' THEN 'skipped'
            WHEN a.send_after > %(now)s::timestamptz THEN 'held'
            ELSE 'pending' END,
       CASE WHEN a.push_opt_out THEN 'push_opted_out'
            WHEN a.endpoint_ids IS NULL THEN 'no_device'
            WHEN NOT a.any_enabled THEN 'endpoint_disabled:' || a.disabled_reason
            WHEN a.send_after = 'infinity' THEN 'window_passed' END,
       CASE WHEN a.send_after < 'infinity' THEN a.send_after END,
       CASE WHEN a.send_before < 'infinity' THEN a.send_before END
  FROM (SELECT u.id, u.push_opt_out, d.endpoint_ids, d.any_enabled, d.disabled_reason,
               (%(zone_at)s::timestamptz[])[z.n] AS send_after,
               (%(zone_until)s::timestamptz[])[z.n] AS send_before
          FROM users u
          CROSS JOIN LATERAL (
                SELECT string_agg(CASE WHEN e.enabled THEN '' ELSE 'd' END || e.id, ','
                                  ORDER BY e.enabled DESC, e.id)
                           FILTER (WHERE e.rank <= %(max_devices)s) AS endpoint_ids,
                       bool_or(e.enabled) AS any_enabled,
                       max(coalesce(e.disabled_reason, 'disabled'))
                           FILTER (WHERE NOT e.enabled) AS disabled_reason
                  FROM (SELECT de.id, de.enabled, de.disabled_reason,
                               row_number() OVER (PARTITION BY de.enabled
                                                  ORDER BY de.last_seen_at DESC, de.id) AS rank
                          FROM device_endpoints de WHERE de.user_id = u.id) e) d
          CROSS JOIN LATERAL (
                SELECT coalesce(array_position(%(zone_names)s::text[],
                                               coalesce(u.timezone, '')), 1) AS n) z
         WHERE ({audience})) a;

-- name: push_endpoints
-- Right before a call's publishes: the endpoints of its rows (ids from the rows' addresses),
-- with whether each is still enabled, and whether each row's user still wants push. A read:
-- a device disabled or a user opted out after it is caught at the next call.
SELECT e.id, e.user_id, e.platform, e.endpoint_arn, e.enabled, e.disabled_reason,
       u.push_opt_out
  FROM device_endpoints e
  LEFT JOIN users u ON u.id = e.user_id
 WHERE e.id = ANY(%(ids)s::bigint[]);

-- name: disable_endpoints
-- SNS answered EndpointDisabled (the platform invalidated the token earlier) or NotFound (the
-- endpoint was deleted): the endpoint is disabled here too, so the next snapshot leaves it
-- out. Conditional on `enabled`: the first reason stays.
UPDATE device_endpoints
   SET enabled = false, disabled_reason = %(reason)s
 WHERE endpoint_arn = ANY(%(arns)s::text[]) AND enabled;

-- name: register_device
-- A device's token registered with SNS (CreatePlatformEndpoint returns the same ARN for the
-- same token): one row per (platform, token). Registering again moves it to its current user,
-- renews last_seen_at and enables it again: a token the app registers again is alive.
INSERT INTO device_endpoints (user_id, platform, token, endpoint_arn)
VALUES (%(user_id)s, %(platform)s, %(token)s, %(endpoint_arn)s)
ON CONFLICT (platform, token) DO UPDATE
   SET user_id = excluded.user_id, endpoint_arn = excluded.endpoint_arn, enabled = true,
       disabled_reason = NULL, last_seen_at = now()
RETURNING id;

-- name: set_push_options
-- In the transaction that creates the campaign (still a draft nobody sends).
UPDATE campaigns SET push_ttl_s = %(ttl_s)s, push_collapse_key = %(collapse_key)s
 WHERE id = %(id)s;
