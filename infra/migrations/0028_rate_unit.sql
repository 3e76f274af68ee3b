-- What an SMS campaign's rate limit counts: messages (one per recipient) or segments (what
-- carriers bill and what a provider's per-second limit in segments counts; a long or UCS-2
-- body is several). Lanes charge each row its segments when the unit is `segments`
-- (streams/throttle.py WindowPacer.admit_costs). Email counts recipients only: the second
-- CHECK refuses `segments` on an email campaign. A constant default: no table rewrite.
ALTER TABLE campaigns
    ADD COLUMN rate_unit text NOT NULL DEFAULT 'messages'
        CHECK (rate_unit IN ('messages', 'segments')),
    ADD CONSTRAINT campaigns_segments_are_sms CHECK (rate_unit = 'messages' OR channel = 'sms');
