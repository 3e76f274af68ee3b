"""Doorbell blocks land where each recipient's own record would: the Python partitioner
agrees with librdkafka's murmur2_random on a real broker, and a started campaign's doorbells
ring for every recipient once, each block on its members' partition, keyed by its first."""

from __future__ import annotations

import random
import uuid

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition

from flashsend.settings import Settings
from producers.campaign import produce_pending, snapshot
from producers.doorbells import kafka_partition, user_key
from producers.topics import ensure_topics
from schemas.doorbell import DOORBELL_BLOCK, doorbell_seqs
from schemas.serde import AvroCodec, registry_client
from sinks.users import seed_users
from tests.integration.campaign_helpers import new_campaign


def _delivered_partitions(settings: Settings, topic: str, keys: list[bytes]) -> list[int]:
    producer = Producer(
        {"bootstrap.servers": settings.kafka_bootstrap, "partitioner": "murmur2_random"}
    )
    placed: dict[bytes, int] = {}

    def on_delivery(err: object, msg: object) -> None:
        assert err is None, err
        placed[msg.key()] = msg.partition()  # type: ignore[attr-defined]

    for key in keys:
        producer.produce(topic, b"x", key, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    return [placed[k] for k in keys]


def test_kafka_partition_agrees_with_librdkafka(settings: Settings) -> None:
    rng = random.Random(3)
    keys = list(
        dict.fromkeys(
            [user_key(rng.randrange(10 ** rng.randrange(1, 19))) for _ in range(600)]
            + [b"a", b"ab", b"abc", b"abcd", uuid.uuid4().bytes]
        )
    )
    for partitions in (settings.partitions, 7):
        topic = f"{settings.topic_recipients}-p{partitions}"
        ensure_topics(settings.kafka_bootstrap, {topic: partitions})
        assert _delivered_partitions(settings, topic, keys) == [
            kafka_partition(k, partitions) for k in keys
        ]


def _consume_all(settings: Settings) -> list[tuple[int, bytes, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    topic = settings.topic_recipients
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(settings.partitions)
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in range(settings.partitions)])
        out: list[tuple[int, bytes, bytes]] = []
        while len(out) < sum(ends.values()):
            msg = consumer.poll(5)
            assert msg is not None, f"{len(out)} of {sum(ends.values())} records consumed"
            assert msg.error() is None, msg.error()
            out.append((msg.partition(), msg.key(), msg.value()))
        return out
    finally:
        consumer.close()


def test_a_campaigns_doorbells_ring_once_for_everyone_on_their_partition(
    settings: Settings,
) -> None:
    seed_users(settings.pg_dsn, 2_000)
    cid = new_campaign(settings, rate=0)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        snapshot(conn, cid, settings.audience_condition)
        produced = produce_pending(settings, conn, cid)
        rows = dict(
            conn.execute(
                "SELECT seq, user_id FROM campaign_recipients WHERE campaign_id = %s "
                "AND status = 'pending'",
                (cid,),
            ).fetchall()
        )
    assert produced == len(rows) > 1_000
    codec = AvroCodec(registry_client(settings.schema_registry_url), "campaign_recipient")
    rung: list[int] = []
    records = _consume_all(settings)
    for partition, key, value in records:
        doorbell = codec.decode(value)
        seqs = doorbell_seqs(doorbell)
        assert doorbell["campaign_id"] == cid and 1 <= len(seqs) <= DOORBELL_BLOCK
        assert key == user_key(rows[seqs[0]]) == user_key(doorbell["user_id"])
        assert {kafka_partition(user_key(rows[s]), settings.partitions) for s in seqs} == {
            partition
        }
        rung += seqs
    assert sorted(rung) == sorted(rows)  # everyone once
    # Full blocks but for one partial block per partition at the end.
    assert len(records) <= len(rows) // DOORBELL_BLOCK + settings.partitions
