-- The owner of a partition's stored offset (sinks/offsets.py, sinks/sql/offsets.sql).
-- epoch: taken anew by every worker the partition is assigned to; every advance names it, so a
-- worker that lost the partition (paused, dropped from the group, resumed) moves nothing and
-- claims nothing. 0 on existing rows: no worker holds 0 (a take makes it at least 1).
-- topic_id: the Kafka topic id the offset belongs to. A topic deleted and created again under
-- the same name gets a new id and starts again at offset 0; the stored offset of the old topic
-- would skip its first records. NULL until a worker first takes the partition.
ALTER TABLE kafka_offsets
    ADD COLUMN epoch bigint NOT NULL DEFAULT 0,
    ADD COLUMN topic_id text;
