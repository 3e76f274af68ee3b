-- Offsets stored with the effects (sinks/offsets.py, docs/architecture.md): every consumer
-- (campaign sender, mail service, feedback agent) advances its partitions' next_offset in the
-- transaction that applies the records, under two fences: the owner epoch and the offset.

-- name: take_partitions
-- On assignment: a row per partition (so the fence always has a row to lock) and a new owner
-- epoch. The upsert waits for the row lock, so a previous owner's advance in flight either
-- commits first (its offset is read here) or runs after and finds the epoch changed (it moves
-- nothing). Partitions in order: two workers taking overlapping sets lock rows in one order.
INSERT INTO kafka_offsets AS k (group_id, topic, partition, next_offset, epoch)
SELECT %(group_id)s, %(topic)s, p, 0, 1 FROM unnest(%(partitions)s::int[]) AS p ORDER BY p
ON CONFLICT (group_id, topic, partition)
DO UPDATE SET epoch = k.epoch + 1, updated_at = now()
RETURNING k.partition, k.next_offset, k.epoch, k.topic_id;

-- name: restart_offsets
-- After take_partitions, in its transaction: where the log no longer matches the stored offset
-- (the topic was recreated, or lost its tail), the start sinks.offsets.start_offset chose, and
-- the topic id the offset now belongs to. The row is locked by the take; the epoch condition
-- only restates that this transaction owns it.
UPDATE kafka_offsets k
   SET next_offset = b.next_offset, topic_id = b.topic_id, updated_at = now()
  FROM unnest(%(partitions)s::int[], %(epochs)s::bigint[], %(next_offsets)s::bigint[],
              %(topic_ids)s::text[]) AS b(partition, epoch, next_offset, topic_id)
 WHERE k.group_id = %(group_id)s AND k.topic = %(topic)s AND k.partition = b.partition
   AND k.epoch = b.epoch;

-- name: advance_offsets
-- The fence of every batch. Only the partition's current owner moves it: with a stale epoch
-- (a worker that lost the partition, however far behind or ahead of the new owner it is) the
-- row is not updated, and the caller applies nothing of that partition. The offset only grows
-- (greatest: gaps in offsets are fine), and old.next_offset tells the caller which records
-- were processed already: those below it are skipped one by one, the rest are applied. The
-- row lock orders this against take_partitions and against the owner's other transactions.
-- pg_current_xact_id() names the transaction: if the answer to its COMMIT is lost, the worker
-- asks pg_xact_status instead of guessing (transaction_status).
UPDATE kafka_offsets k
   SET next_offset = greatest(k.next_offset, b.last_offset + 1), updated_at = now()
  FROM unnest(%(partitions)s::int[], %(epochs)s::bigint[], %(last_offsets)s::bigint[])
       AS b(partition, epoch, last_offset)
 WHERE k.group_id = %(group_id)s AND k.topic = %(topic)s AND k.partition = b.partition
   AND k.epoch = b.epoch
RETURNING k.partition, old.next_offset, pg_current_xact_id()::text;

-- name: transaction_status
-- After the answer to a COMMIT was lost: whether that transaction committed ('committed',
-- 'aborted', 'in progress'). Read-only; any connection may ask.
SELECT pg_xact_status(%(xid)s::xid8);

-- name: end_transaction_backend
-- The backend still holds the in-doubt transaction open: its COMMIT never arrived (the
-- connection is half-open). Ending it aborts the transaction, so the next transaction_status
-- is final. Matched on the transaction id too, so a backend that reused the pid is never hit.
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
 WHERE pid = %(pid)s AND backend_xid = %(xid)s::xid8::xid;

-- name: ensure_offsets
-- A row per partition, for writers that are not consumers (replay) and need a row to lock.
-- A new row's epoch is 0, which no worker holds.
INSERT INTO kafka_offsets (group_id, topic, partition, next_offset)
SELECT %(group_id)s, %(topic)s, p, 0 FROM unnest(%(partitions)s::int[]) AS p
ON CONFLICT DO NOTHING;

-- name: load_offsets
-- A seek that is not an assignment (Faust seeks again while its flow is stopped): the stored
-- offsets only. The epoch is never read here: only a take may make a worker an owner.
SELECT partition, next_offset FROM kafka_offsets
 WHERE group_id = %(group_id)s AND topic = %(topic)s AND partition = ANY(%(partitions)s);
