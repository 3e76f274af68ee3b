-- Recipients of the campaign per partition of campaign.recipients, written when its doorbells
-- are first produced. The lanes split the campaign's rate in proportion to them, so the
-- partitions that drew more users do not finish last (streams/throttle.partition_budget).
-- NULL (campaigns produced before this, or not yet produced): equal shares.
ALTER TABLE campaigns ADD COLUMN IF NOT EXISTS partition_weights int[];
