-- A third channel: mobile push through Amazon SNS platform endpoints.
--
-- For a push campaign the existing columns keep their roles with the channel's meaning, as
-- for SMS: `template` is the notification's body ({{first_name}}, {{promo_code}}),
-- `from_address` its title, `configuration_set` unused. The notification's lifetime and
-- collapse key are the campaign's own (streams/push_message.py puts them in each platform's
-- payload). Constant defaults: no table rewrite.
ALTER TABLE campaigns DROP CONSTRAINT IF EXISTS campaigns_channel_check;
ALTER TABLE campaigns
    ADD CONSTRAINT campaigns_channel_check CHECK (channel IN ('email', 'sms', 'push')),
    ADD COLUMN push_ttl_s integer CHECK (push_ttl_s IS NULL OR push_ttl_s BETWEEN 0 AND 2419200),
    ADD COLUMN push_collapse_key text;

-- A user who turned push notifications off: the push snapshot leaves them out and the
-- channel re-checks it right before each publish (skipped, 'push_opted_out'). Constant
-- default: no table rewrite.
ALTER TABLE users ADD COLUMN push_opt_out boolean NOT NULL DEFAULT false;

-- A user's devices: one SNS platform endpoint each (CreatePlatformEndpoint of the device's
-- token in the platform application of its platform). A disabled endpoint (the platform said
-- the token is invalid, or SNS answered EndpointDisabled) is never published to: the
-- snapshot leaves it out of its row and the channel skips it with its reason.
CREATE TABLE device_endpoints (
    id              bigserial PRIMARY KEY,
    user_id         bigint      NOT NULL,
    platform        text        NOT NULL CHECK (platform IN ('FCM', 'APNS')),
    token           text        NOT NULL,
    endpoint_arn    text        NOT NULL UNIQUE,
    enabled         boolean     NOT NULL DEFAULT true,
    disabled_reason text,
    last_seen_at    timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (platform, token)
);
-- The snapshot's join and the channel's lookup by user.
CREATE INDEX device_endpoints_user ON device_endpoints (user_id);

COMMENT ON COLUMN campaign_recipients.email IS
    'the recipient''s address on the campaign''s channel: an email address, the normalised '
    'E.164 number of an SMS campaign, or the ids of the user''s enabled device endpoints '
    '(comma-separated) of a push campaign';

-- A push delivery failure that says the token is dead reaches the feedback worker like any
-- event and suppresses the endpoint's ARN (streams/push_feedback.py; an ARN never collides
-- with an email address or a phone number). This trigger turns that suppression into what it
-- means for the device: its endpoint is disabled in our table, so the next snapshot and the
-- channel's check at the call skip it. Only ARNs of SNS endpoints fire it.
CREATE FUNCTION disable_suppressed_endpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE device_endpoints
       SET enabled = false, disabled_reason = coalesce(disabled_reason, NEW.reason)
     WHERE endpoint_arn = NEW.email AND enabled;
    RETURN NULL;
END $$;

CREATE TRIGGER email_suppressions_disable_endpoint
    AFTER INSERT ON email_suppressions
    FOR EACH ROW WHEN (NEW.email LIKE 'arn:aws:sns:%:endpoint/%')
    EXECUTE FUNCTION disable_suppressed_endpoint();
