"""The workers' reconciler keeps one client for log-end offsets across ticks; it must still
see records produced after its first question."""

from __future__ import annotations

from confluent_kafka import Producer

from flashsend.settings import Settings
from producers.reconcile import Reconciler
from producers.topics import ensure_topics


def test_one_offsets_client_per_reconciler_and_it_sees_new_records(settings: Settings) -> None:
    ensure_topics(settings.kafka_bootstrap, {settings.topic_recipients: settings.partitions})
    reconciler = Reconciler(settings)
    before = reconciler.log_end_offsets()
    client = reconciler._offsets_client()
    assert sorted(before) == list(range(settings.partitions))
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for i in range(5):
        producer.produce(settings.topic_recipients, key=b"k", value=b"x%d" % i, partition=2)
    assert producer.flush(10) == 0
    after = reconciler.log_end_offsets()
    assert after == {**before, 2: before[2] + 5}
    assert reconciler._offsets_client() is client
