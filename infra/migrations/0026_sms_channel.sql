-- A second channel: SMS campaigns through AWS End User Messaging SMS.
--
-- campaigns.channel says which provider a campaign's lanes call (streams/channel.py). For an
-- SMS campaign the existing columns keep their roles with the channel's meaning: `template`
-- is the message body ({{first_name}}, {{promo_code}}), `from_address` the origination
-- identity (a phone number, pool or sender id), `configuration_set` the SMS configuration
-- set. A constant default: no table rewrite.
ALTER TABLE campaigns
    ADD COLUMN channel text NOT NULL DEFAULT 'email' CHECK (channel IN ('email', 'sms'));

-- The user's mobile number as given; the SMS snapshot normalises it (streams/phones.py and
-- its SQL twin in snapshot_sms_recipients) and skips what is not E.164. Nullable, no
-- default: no table rewrite.
ALTER TABLE users ADD COLUMN phone text;

COMMENT ON COLUMN campaign_recipients.email IS
    'the recipient''s address on the campaign''s channel: an email address, or the normalised '
    'E.164 number of an SMS campaign';
COMMENT ON TABLE email_suppressions IS
    'addresses never to contact again, keyed by the normalised address: an email address, or an '
    'E.164 number (SMS opt-outs); the two never collide (a number has no @)';
