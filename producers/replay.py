"""`flashsend replay`: plan and perform an offset reset of one of our consumers.

Our workers seek to the offsets stored in PostgreSQL (`kafka_offsets`) on every assignment, so
that store is what a replay must change; the broker's committed offsets are changed too (lag
dashboards, and any consumer that reads them). Both are written in one step per replay:

1. lock the stored offsets of the partitions (`FOR UPDATE`) and compare them with the plan
   (a worker that ran since → abort: re-plan);
2. set them (compare-and-set) and insert the audit rows, in that open transaction;
3. alter the broker group's committed offsets — the broker refuses while the group has
   members, a second guard against a worker that joined after the check;
4. commit. If step 3 fails the transaction rolls back and nothing changed. If the commit
   fails after step 3, only the broker moved: workers still seek to PostgreSQL, so behaviour
   is unchanged and re-running the replay finishes the job.

PostgreSQL and Kafka share no transaction, so "atomic per partition" means: the database
side is atomic for all partitions together, and the broker side is applied inside it.
"""

from __future__ import annotations

import getpass
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from psycopg.types.json import Jsonb

from flashsend.errors import FlashsendError
from flashsend.settings import Settings
from producers.topics import admin_client
from schemas import serde
from schemas.doorbell import doorbell_seqs
from schemas.serde import AvroCodec, RegistryUnavailable, SerdeError
from sinks.pg_arrays import int_array
from sinks.queries import query
from streams.rules.mail_logic import CancelMail, CreateMail, StaleEvent, parse_order_event
from streams.rules.replay_plan import (
    PartitionPlan,
    Refusal,
    clamp_target,
    classify_campaign,
    classify_mail,
    refusals,
    replay_range,
)


class ReplayRefused(FlashsendError):
    """The replay was refused; the plan says why."""


@dataclass(frozen=True)
class Binding:
    """One of our consumers: its offset store group, its Kafka group, topic and contract."""

    kind: str  # campaign | mail
    group_id: str
    broker_group: str
    topic: str
    schema: str


def bindings(s: Settings) -> list[Binding]:
    return [
        Binding("campaign", s.group_sender, s.app_id, s.topic_recipients, "campaign_recipient"),
        Binding("mail", s.group_mail, s.mail_app_id, s.topic_order_events, "order_event"),
    ]


def resolve(s: Settings, group: str, topic: str) -> Binding:
    for b in bindings(s):
        if topic == b.topic and group in (b.group_id, b.broker_group):
            return b
    known = ", ".join(f"--group {b.group_id} --topic {b.topic}" for b in bindings(s))
    raise FlashsendError(f"no consumer of ours reads {topic} as group {group}; known: {known}")


@dataclass
class Plan:
    binding: Binding
    partitions: list[PartitionPlan]
    live_members: int
    campaigns: dict[int, str]
    refusals: list[Refusal]

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.binding.kind,
            "group_id": self.binding.group_id,
            "broker_group": self.binding.broker_group,
            "topic": self.binding.topic,
            "live_members": self.live_members,
            "campaigns": {str(k): v for k, v in self.campaigns.items()},
            "partitions": [p.as_dict() for p in self.partitions],
            "refusals": [r.__dict__ for r in self.refusals],
        }


def _consumer(s: Settings) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": s.kafka_bootstrap,
            "group.id": f"flashsend-replay-reader-{uuid.uuid4().hex[:8]}",  # assign only, no join
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )


def live_members(admin: AdminClient, group: str, timeout: float = 10.0) -> int:
    try:
        description = admin.describe_consumer_groups([group])[group].result(timeout=timeout)
    except KafkaException as exc:
        raise FlashsendError(f"cannot describe consumer group {group}: {exc}") from exc
    return len(description.members or [])


def read_ranges(
    consumer: Consumer, topic: str, ranges: dict[int, tuple[int, int]]
) -> dict[int, list[Any]]:
    """Records with start <= offset < end of each partition (gaps allowed), all partitions
    fetched together (one assignment: a fetch round per partition would cost seconds)."""
    out: dict[int, list[Any]] = {p: [] for p in ranges}
    todo = {p: end for p, (start, end) in ranges.items() if start < end}
    if not todo:
        return out
    consumer.assign([TopicPartition(topic, p, ranges[p][0]) for p in todo])
    idle_deadline = time.monotonic() + 10.0
    while todo and time.monotonic() < idle_deadline:
        for msg in consumer.consume(500, timeout=0.5):
            p = int(msg.partition() or 0)
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    todo.pop(p, None)
                continue
            idle_deadline = time.monotonic() + 10.0
            end = todo.get(p)
            offset = int(msg.offset() or 0)
            if end is None or offset >= end:
                todo.pop(p, None)
                continue
            out[p].append(msg)
            if offset >= end - 1:
                todo.pop(p, None)
    if todo:
        raise FlashsendError(f"reading {topic} partitions {sorted(todo)} stalled")
    return out


def plan_replay(
    s: Settings,
    binding: Binding,
    *,
    to_offset: int | None = None,
    to_time_ms: int | None = None,
    partitions: list[int] | None = None,
    now_ms: int | None = None,
) -> Plan:
    now_ms = now_ms or int(time.time() * 1000)
    admin = admin_client(s.kafka_bootstrap)
    consumer = _consumer(s)
    codec = serde.codec(s, binding.schema)
    try:
        md = consumer.list_topics(binding.topic, timeout=10).topics.get(binding.topic)
        if md is None or md.error is not None:
            raise FlashsendError(f"topic {binding.topic} does not exist")
        wanted = sorted(md.partitions) if not partitions else sorted(set(partitions))
        with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
            stored: dict[int, int] = {
                int(p): int(o)
                for p, o in conn.execute(
                    query("metrics_offsets"), {"group_id": binding.group_id, "topic": binding.topic}
                )
            }
            by_time: dict[int, int] = {}
            if to_time_ms is not None:
                found = consumer.offsets_for_times(
                    [TopicPartition(binding.topic, p, to_time_ms) for p in wanted], timeout=10
                )
                by_time = {tp.partition: tp.offset for tp in found}
            plans: list[PartitionPlan] = []
            campaigns: dict[int, str] = {}
            for p in wanted:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(binding.topic, p), timeout=10
                )
                raw = stored.get(p)
                current = max(int(raw or 0), low)
                requested = by_time.get(p, high) if to_time_ms is not None else to_offset
                target = clamp_target(
                    high if requested is None or requested < 0 else requested, low, high
                )
                plans.append(PartitionPlan(p, current, target, low, high, stored=raw))
            ranges = {p.partition: replay_range(p.current, p.target) for p in plans}
            records_of = read_ranges(consumer, binding.topic, ranges)
            for plan in plans:
                records = records_of[plan.partition]
                plan.records = len(records)
                if records and plan.direction == "rewind":
                    plan.target_timestamp_ms = records[0].timestamp()[1]
                if binding.kind == "campaign":
                    plan.counts, seen = _campaign_counts(conn, codec, records)
                    campaigns.update(seen)
                else:
                    plan.counts = _mail_counts(conn, codec, records, s, now_ms)
        members = live_members(admin, binding.broker_group)
    finally:
        consumer.close()
    found_refusals = refusals(
        kind=binding.kind,
        live_members=members,
        partitions=plans,
        campaigns=campaigns,
        now_ms=now_ms,
        dedupe_retention_s=s.mail_retention_s,
    )
    return Plan(binding, plans, members, campaigns, found_refusals)


def _campaign_counts(
    conn: psycopg.Connection[Any], codec: AvroCodec, records: list[Any]
) -> tuple[dict[str, int], dict[int, str]]:
    keys: list[tuple[int, int]] = []
    dead = 0
    for msg in records:
        try:
            doorbell = codec.decode(msg.value())
        except SerdeError:
            dead += 1
            continue
        except RegistryUnavailable as exc:
            raise FlashsendError(f"schema registry unavailable, no plan: {exc}") from None
        cid = int(doorbell["campaign_id"])
        keys.extend((cid, int(seq)) for seq in doorbell_seqs(doorbell))
    rows: dict[tuple[int, int], tuple[str | None, str | None]] = {}
    for i in range(0, len(keys), 10_000):
        chunk = keys[i : i + 10_000]
        for cid, seq, row_status, campaign_status in conn.execute(
            query("plan_campaign_rows"),
            {
                "campaign_ids": int_array(k[0] for k in chunk),
                "campaigns": int_array({k[0] for k in chunk}),
                "seqs": int_array(k[1] for k in chunk),
            },
        ):
            rows[(int(cid), int(seq))] = (row_status, campaign_status)
    counts, campaigns = classify_campaign(keys, rows)
    if dead:
        counts["dead"] = counts.get("dead", 0) + dead
    return counts, campaigns


def _mail_counts(
    conn: psycopg.Connection[Any],
    codec: AvroCodec,
    records: list[Any],
    s: Settings,
    now_ms: int,
) -> dict[str, int]:
    events: list[tuple[str, str | None, str | None]] = []
    for msg in records:
        try:
            parsed = parse_order_event(
                codec.decode(msg.value()),
                now_ms=now_ms,
                max_age_s=s.mail_event_max_age_s,
                at_most_once_templates=s.mail_at_most_once_templates,
            )
        except SerdeError:
            events.append(("dead", None, None))
            continue
        except RegistryUnavailable as exc:
            raise FlashsendError(f"schema registry unavailable, no plan: {exc}") from None
        if isinstance(parsed, CreateMail):
            events.append(("create", parsed.event_id, parsed.dedupe_key))
        elif isinstance(parsed, CancelMail):
            events.append(("cancel", parsed.event_id, None))
        elif isinstance(parsed, StaleEvent):
            events.append(("ignored", None, None))
        else:
            events.append(("dead", None, None))
    ids = [e[1] for e in events if e[0] == "create" and e[1] and _is_uuid(e[1])]
    keys = [e[2] for e in events if e[0] == "create" and e[2]]
    known_ids: set[str] = set()
    known_keys: set[str] = set()
    if ids or keys:
        for event_id, key in conn.execute(
            query("plan_mail_known"), {"event_ids": ids, "dedupe_keys": keys}
        ):
            if event_id:
                known_ids.add(str(event_id))
            known_keys.add(str(key))
    return classify_mail(events, known_ids, known_keys)


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def operator(s: Settings) -> tuple[str, str]:
    """(who, host) for the audit tables."""
    return s.operator or getpass.getuser(), socket.gethostname()


def apply_replay(s: Settings, plan: Plan, *, reason: str, forced: bool) -> str:
    """Perform the reset as planned (see the module docstring); returns the replay id."""
    b = plan.binding
    moves = [p for p in plan.partitions if p.direction != "none"]
    if not moves:
        raise ReplayRefused("nothing to do")
    replay_id = str(uuid.uuid4())
    who, host = operator(s)
    admin = admin_client(s.kafka_bootstrap)
    params = {"group_id": b.group_id, "topic": b.topic}
    with psycopg.connect(s.pg_dsn) as conn, conn.transaction():
        ids = [p.partition for p in moves]
        conn.execute(query("ensure_offsets"), {**params, "partitions": ids})
        locked: dict[int, int] = {
            int(p): int(o)
            for p, o in conn.execute(query("replay_lock_offsets"), {**params, "partitions": ids})
        }
        stale = [p.partition for p in moves if int(locked[p.partition]) != (p.stored or 0)]
        if stale:
            raise ReplayRefused(
                f"partitions {stale} moved since the plan (a worker ran?): plan again"
            )
        if live_members(admin, b.broker_group):
            raise ReplayRefused("a member joined the consumer group since the plan: stop it")
        changed = conn.execute(
            query("replay_set_offsets"),
            {
                **params,
                "partitions": [p.partition for p in moves],
                "from_offsets": [p.stored or 0 for p in moves],
                "to_offsets": [p.target for p in moves],
            },
        ).fetchall()
        if len(changed) != len(moves):
            raise ReplayRefused("the stored offsets changed during the reset: plan again")
        for p in moves:
            conn.execute(
                query("insert_offset_reset"),
                {
                    **params,
                    "replay_id": replay_id,
                    "requested_by": who,
                    "host": host,
                    "reason": reason,
                    "broker_group": b.broker_group,
                    "partition": p.partition,
                    "from_offset": p.current,
                    "to_offset": p.target,
                    "records": p.records,
                    "would_send": p.would_send,
                    "deduplicated": p.deduplicated,
                    "forced": forced,
                    "plan": Jsonb(p.as_dict()),
                },
            )
        _alter_broker_offsets(admin, b, moves)
    return replay_id


def _alter_broker_offsets(admin: AdminClient, b: Binding, moves: list[PartitionPlan]) -> None:
    request = ConsumerGroupTopicPartitions(
        b.broker_group, [TopicPartition(b.topic, p.partition, p.target) for p in moves]
    )
    try:
        result = admin.alter_consumer_group_offsets([request])[b.broker_group].result(timeout=30)
    except KafkaException as exc:
        raise ReplayRefused(
            f"the broker refused the reset of group {b.broker_group} (nothing was changed): {exc}"
        ) from exc
    errors = [f"{tp.partition}: {tp.error}" for tp in result.topic_partitions or [] if tp.error]
    if errors:
        raise ReplayRefused(f"the broker refused some partitions (nothing was changed): {errors}")
