-- campaign_recipients is partitioned by campaign (LIST on campaign_id): one partition per
-- campaign, created and loaded by the campaign's snapshot (producers/campaign.snapshot,
-- sinks/recipient_partitions.py). Measured on the bench database (docs/decisions.md):
--
-- 1. A snapshot into the one shared table got slower as campaigns accumulated: with 16M rows
--    of earlier campaigns, the INSERT of 860k rows took 3.6–5.1 s and the ANALYZE it needs
--    (statistics for the workers' plans) 0.7–0.9 s. Into a fresh table, with the two unique
--    indexes built after the load, the same rows take ~2 s and ANALYZE 0.07 s, whatever the
--    history.
-- 2. Retiring a campaign becomes DETACH + DROP of its partition instead of a DELETE of its
--    rows (docs/performance.md).
--
-- No DEFAULT partition: every attach would have to check (scan) the default partition's rows
-- for the new campaign id. Rows of a campaign that has no partition are refused; only the
-- snapshot inserts recipients.
-- The counter triggers of migration 0010 move to the partitioned table (statement triggers
-- with transition tables see the rows of every partition a statement touches).

ALTER TABLE campaign_recipients RENAME TO campaign_recipients_legacy;
ALTER TABLE campaign_recipients_legacy
    RENAME CONSTRAINT campaign_recipients_pkey TO campaign_recipients_legacy_pkey;
ALTER TABLE campaign_recipients_legacy
    RENAME CONSTRAINT campaign_recipients_campaign_id_user_id_key
    TO campaign_recipients_legacy_campaign_id_user_id_key;
DROP TRIGGER campaign_counts_insert ON campaign_recipients_legacy;
DROP TRIGGER campaign_counts_update ON campaign_recipients_legacy;
DROP TRIGGER campaign_counts_delete ON campaign_recipients_legacy;
DROP TRIGGER campaign_counts_truncate ON campaign_recipients_legacy;

CREATE TABLE campaign_recipients (LIKE campaign_recipients_legacy INCLUDING DEFAULTS)
    PARTITION BY LIST (campaign_id);
ALTER TABLE campaign_recipients
    ADD CONSTRAINT campaign_recipients_pkey PRIMARY KEY (campaign_id, seq),
    ADD CONSTRAINT campaign_recipients_campaign_id_user_id_key UNIQUE (campaign_id, user_id);

CREATE TRIGGER campaign_counts_insert AFTER INSERT ON campaign_recipients
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION campaign_counts_on_insert();
CREATE TRIGGER campaign_counts_update AFTER UPDATE ON campaign_recipients
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION campaign_counts_on_update();
CREATE TRIGGER campaign_counts_delete AFTER DELETE ON campaign_recipients
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION campaign_counts_on_delete();
CREATE TRIGGER campaign_counts_truncate AFTER TRUNCATE ON campaign_recipients
    FOR EACH STATEMENT EXECUTE FUNCTION campaign_counts_on_truncate();

-- Campaigns snapshotted before this migration keep their rows where they are: the old table
-- becomes the partition for exactly their ids (one validating scan, once).
DO $$
DECLARE
    ids text;
BEGIN
    SELECT string_agg(DISTINCT campaign_id::text, ',') INTO ids FROM campaign_recipients_legacy;
    IF ids IS NULL THEN
        DROP TABLE campaign_recipients_legacy;
    ELSE
        EXECUTE format('ALTER TABLE campaign_recipients ATTACH PARTITION '
                       'campaign_recipients_legacy FOR VALUES IN (%s)', ids);
    END IF;
END $$;
