-- Rate ramp for a warming domain (streams/ramp.py). `ramp` is the campaign's steps as a
-- jsonb list [{"at_s", "rate"}] (NULL = no ramp); the ramp follows the campaign's sending
-- time, which is `sending_s` (seconds spent in 'sending' before the current stretch) plus the
-- time since `sending_since` (set while the campaign is 'sending', NULL otherwise).
-- A trigger keeps the two on every change of status, whichever statement makes it (start,
-- pause, resume, a release, an automatic pause): pause time never counts, and no statement
-- that moves a campaign has to remember the ramp. clock_timestamp(), not now(): the snapshot's
-- long transaction moves the campaign to 'sending' at its end, and the ramp starts then.
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS ramp jsonb;
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS sending_s double precision NOT NULL DEFAULT 0;
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS sending_since timestamptz;

CREATE OR REPLACE FUNCTION campaigns_sending_clock() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'sending' AND (TG_OP = 'INSERT' OR OLD.status <> 'sending') THEN
        NEW.sending_since := clock_timestamp();
    ELSIF TG_OP = 'UPDATE' AND OLD.status = 'sending' AND NEW.status <> 'sending' THEN
        NEW.sending_s := OLD.sending_s + greatest(0, coalesce(
            extract(epoch FROM clock_timestamp() - OLD.sending_since)::double precision, 0));
        NEW.sending_since := NULL;
    END IF;
    RETURN NEW;
END $$;

DROP TRIGGER IF EXISTS campaigns_sending_clock ON campaigns;
CREATE TRIGGER campaigns_sending_clock BEFORE INSERT OR UPDATE OF status ON campaigns
    FOR EACH ROW EXECUTE FUNCTION campaigns_sending_clock();

-- Campaigns already sending when this runs start their clock now.
UPDATE campaigns SET sending_since = clock_timestamp()
 WHERE status = 'sending' AND sending_since IS NULL;
