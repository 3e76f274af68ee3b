-- Operations: replay (offset reset), dead-letter replay, metrics read at scrape time.

-- name: replay_lock_offsets
-- The stored offsets of the partitions being reset, locked until the reset commits: a worker
-- that starts meanwhile blocks on its fenced advance instead of racing the reset.
SELECT partition, next_offset FROM kafka_offsets
 WHERE group_id = %(group_id)s AND topic = %(topic)s AND partition = ANY(%(partitions)s)
 ORDER BY partition
   FOR UPDATE;

-- name: replay_set_offsets
-- Compare-and-set per partition: only where the offset is still what the plan showed. A
-- partition whose offset moved since (a worker ran) is not reset, and the caller rolls back.
UPDATE kafka_offsets k
   SET next_offset = b.to_offset, updated_at = now()
  FROM unnest(%(partitions)s::int[], %(from_offsets)s::bigint[], %(to_offsets)s::bigint[])
       AS b(partition, from_offset, to_offset)
 WHERE k.group_id = %(group_id)s AND k.topic = %(topic)s AND k.partition = b.partition
   AND k.next_offset = b.from_offset
RETURNING k.partition;

-- name: insert_offset_reset
INSERT INTO offset_resets (replay_id, requested_by, host, reason, group_id, broker_group, topic,
                           partition, from_offset, to_offset, records, would_send, deduplicated,
                           forced, plan)
VALUES (%(replay_id)s, %(requested_by)s, %(host)s, %(reason)s, %(group_id)s, %(broker_group)s,
        %(topic)s, %(partition)s, %(from_offset)s, %(to_offset)s, %(records)s, %(would_send)s,
        %(deduplicated)s, %(forced)s, %(plan)s);

-- name: plan_campaign_rows
-- For each doorbell in a replay range: the row's status and its campaign's status (NULL when
-- missing). Primary-key lookups only. %(campaigns)s: the distinct ids (see claim_batch).
SELECT b.campaign_id, b.seq, r.status AS row_status, c.status AS campaign_status
  FROM unnest(%(campaign_ids)s::bigint[], %(seqs)s::int[]) AS b(campaign_id, seq)
  LEFT JOIN campaign_recipients r ON r.campaign_id = b.campaign_id AND r.seq = b.seq
                                   AND r.campaign_id = ANY(%(campaigns)s::bigint[])
  LEFT JOIN campaigns c ON c.id = b.campaign_id;

-- name: plan_mail_known
-- Which of the replayed order events would be swallowed by the UNIQUE event_id / dedupe_key
-- of `mail` (the consumer's deduplication).
SELECT m.event_id::text, m.dedupe_key FROM mail m
 WHERE m.event_id = ANY(%(event_ids)s::uuid[]) OR m.dedupe_key = ANY(%(dedupe_keys)s);

-- name: insert_dlq_replay
INSERT INTO dlq_replays (replay_id, requested_by, host, reason, dlq_topic, dlq_partition,
                         dlq_offset, dead_reason, target_topic, target_partition,
                         original_offset, new_offset)
VALUES (%(replay_id)s, %(requested_by)s, %(host)s, %(reason)s, %(dlq_topic)s,
        %(dlq_partition)s, %(dlq_offset)s, %(dead_reason)s, %(target_topic)s,
        %(target_partition)s, %(original_offset)s, %(new_offset)s);

-- name: dlq_replayed
SELECT dlq_partition, dlq_offset, max(created_at) AS last_replayed_at, count(*) AS times
  FROM dlq_replays WHERE dlq_topic = %(dlq_topic)s
 GROUP BY dlq_partition, dlq_offset;

-- name: metrics_offsets
-- Consumer lag per partition = log end (from the broker) - next_offset (from here).
SELECT partition, next_offset FROM kafka_offsets
 WHERE group_id = %(group_id)s AND topic = %(topic)s;

-- name: metrics_campaign_feedback
-- Complaint and bounce rates of the campaigns sending or recently finished (the feedback
-- agent's counters; tiny table, one row per campaign).
SELECT f.campaign_id, f.sent, f.complained, f.bounced
  FROM campaign_feedback f JOIN campaigns c ON c.id = f.campaign_id
 WHERE c.status IN ('sending', 'paused') OR c.updated_at > now() - interval '1 hour';

-- name: metrics_campaign_counts
-- Recipients per status of the campaigns sending or recently finished, from the trigger-kept
-- counter shards (at most 64 rows per status and campaign; never a scan of the recipients).
-- Read-only: a concurrent writer's shard row is read as of its last commit.
SELECT s.campaign_id, s.status, sum(s.n)::bigint AS n
  FROM campaign_status_counts s JOIN campaigns c ON c.id = s.campaign_id
 WHERE (c.status IN ('sending', 'paused') OR c.updated_at > now() - interval '1 hour')
   AND s.status <> 'requeue'
 GROUP BY s.campaign_id, s.status;
