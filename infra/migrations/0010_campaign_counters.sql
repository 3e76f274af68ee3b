-- Campaign speed, measured on 860k recipients (docs/decisions.md):
--
-- 1. The foreign key campaign_recipients -> campaigns fired one RI trigger per inserted row:
--    6.5 s of an 18 s snapshot. Recipients are only ever inserted by the snapshot, inside the
--    transaction that holds the campaign row (producers/campaign.snapshot), so the reference
--    cannot dangle; the constraint bought nothing and cost a third of the snapshot.
-- 2. `campaign status` counted the campaign's rows in one pass: 0.9–2 s on 860k rows under
--    load. Counts now live in campaign_status_counts, kept by statement-level triggers with
--    transition tables: every writer (snapshot, claim, results, reconcile, cancel) is covered
--    without touching its SQL, and a rolled-back statement rolls its counts back with it.
--    The pseudo-status 'requeue' counts pending rows flagged for re-producing, so reconcile
--    knows without a scan whether there is anything to take.
--    Rows are sharded by the writing backend (pg_backend_pid() % 64) so two workers never wait
--    on the same counter row; reading is a sum over at most 64 x 7 small rows.

ALTER TABLE campaign_recipients DROP CONSTRAINT IF EXISTS campaign_recipients_campaign_id_fkey;

CREATE TABLE campaign_status_counts (
    campaign_id   bigint      NOT NULL,
    shard         smallint    NOT NULL,
    status        text        NOT NULL,
    n             bigint      NOT NULL,
    first_sent_at timestamptz,            -- only on status 'sent' rows
    last_sent_at  timestamptz,
    PRIMARY KEY (campaign_id, shard, status)
);

-- Each event has its own function: a function may only name the transition tables its
-- trigger declares. ORDER BY: counter rows are always locked in the same order, so two
-- backends that share a shard cannot deadlock.
CREATE FUNCTION campaign_counts_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO campaign_status_counts AS c
           (campaign_id, shard, status, n, first_sent_at, last_sent_at)
    SELECT campaign_id, pg_backend_pid() % 64, status, count(*),
           min(sent_at) FILTER (WHERE status = 'sent'), max(sent_at) FILTER (WHERE status = 'sent')
      FROM (SELECT campaign_id, status, sent_at FROM new_rows
            UNION ALL
            SELECT campaign_id, 'requeue', NULL FROM new_rows WHERE requeue) d
     GROUP BY campaign_id, status ORDER BY campaign_id, status
    ON CONFLICT (campaign_id, shard, status) DO UPDATE
       SET n = c.n + EXCLUDED.n,
           first_sent_at = LEAST(c.first_sent_at, EXCLUDED.first_sent_at),
           last_sent_at = GREATEST(c.last_sent_at, EXCLUDED.last_sent_at);
    RETURN NULL;
END $$;

CREATE FUNCTION campaign_counts_on_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO campaign_status_counts AS c
           (campaign_id, shard, status, n, first_sent_at, last_sent_at)
    SELECT d.campaign_id, pg_backend_pid() % 64, d.status, sum(d.n),
           min(d.sent_at) FILTER (WHERE d.status = 'sent'),
           max(d.sent_at) FILTER (WHERE d.status = 'sent')
      FROM (SELECT campaign_id, status, 1 AS n, sent_at FROM new_rows
            UNION ALL
            SELECT campaign_id, status, -1, NULL FROM old_rows
            UNION ALL
            SELECT campaign_id, 'requeue', 1, NULL FROM new_rows WHERE requeue
            UNION ALL
            SELECT campaign_id, 'requeue', -1, NULL FROM old_rows WHERE requeue) d
     GROUP BY d.campaign_id, d.status
    HAVING sum(d.n) <> 0
     ORDER BY d.campaign_id, d.status
    ON CONFLICT (campaign_id, shard, status) DO UPDATE
       SET n = c.n + EXCLUDED.n,
           first_sent_at = LEAST(c.first_sent_at, EXCLUDED.first_sent_at),
           last_sent_at = GREATEST(c.last_sent_at, EXCLUDED.last_sent_at);
    RETURN NULL;
END $$;

CREATE FUNCTION campaign_counts_on_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO campaign_status_counts AS c (campaign_id, shard, status, n)
    SELECT campaign_id, pg_backend_pid() % 64, status, -count(*)
      FROM (SELECT campaign_id, status FROM old_rows
            UNION ALL
            SELECT campaign_id, 'requeue' FROM old_rows WHERE requeue) d
     GROUP BY campaign_id, status ORDER BY campaign_id, status
    ON CONFLICT (campaign_id, shard, status) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END $$;

CREATE FUNCTION campaign_counts_on_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM campaign_status_counts;
    RETURN NULL;
END $$;

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

-- Campaigns that existed before this migration.
INSERT INTO campaign_status_counts (campaign_id, shard, status, n, first_sent_at, last_sent_at)
SELECT campaign_id, 0, status, count(*),
       min(sent_at) FILTER (WHERE status = 'sent'), max(sent_at) FILTER (WHERE status = 'sent')
  FROM (SELECT campaign_id, status, sent_at FROM campaign_recipients
        UNION ALL
        SELECT campaign_id, 'requeue', NULL FROM campaign_recipients WHERE requeue) d
 GROUP BY campaign_id, status;
