-- The workers' two hottest statements (the claim and record_results, sinks/sql/recipients.sql)
-- now name the campaign's own partition instead of campaign_recipients: on the parent each
-- execution was planned again (a generic plan there locks every partition at each
-- execution, so PostgreSQL kept custom plans), and planning was ~30 % of their server time
-- (docs/decisions.md).
-- A statement that names a partition fires that partition's statement triggers, not the
-- parent's, so each campaign partition gets its own copy of the counter trigger for updates
-- (migration 0010). Statements that name the parent still fire only the parent's trigger:
-- no row is counted twice. New partitions get the trigger from
-- sinks/recipient_partitions.attach; the workers name a partition only when it carries the
-- trigger (own_partition), so a table without it is updated through the parent, as before.
-- Only updates: recipients are inserted and deleted through the parent (or counted by the
-- snapshot itself).
DO $$
DECLARE
    part regclass;
BEGIN
    FOR part IN
        SELECT i.inhrelid::regclass
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'campaign_recipients'::regclass
           AND c.relname ~ '^campaign_recipients_[0-9]+$'
    LOOP
        EXECUTE format(
            'CREATE TRIGGER campaign_counts_update_direct AFTER UPDATE ON %s '
            'REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows '
            'FOR EACH STATEMENT EXECUTE FUNCTION campaign_counts_on_update()', part);
    END LOOP;
END $$;
