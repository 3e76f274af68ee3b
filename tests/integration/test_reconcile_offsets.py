"""The workers' reconciler keeps one client for log-end offsets across ticks; it must still
see records produced after its first question."""

from __future__ import annotations

import pytest
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


def test_closing_closes_the_kept_client_and_a_later_question_opens_a_new_one(
    settings: Settings,
) -> None:
    ensure_topics(settings.kafka_bootstrap, {settings.topic_recipients: settings.partitions})
    with Reconciler(settings) as reconciler:
        ends = reconciler.log_end_offsets()
        client = reconciler._offsets_client()
    with pytest.raises(RuntimeError, match="closed"):
        client.list_topics(settings.topic_recipients, timeout=5)
    assert reconciler.log_end_offsets().keys() == ends.keys()
    assert reconciler._offsets_client() is not client
    reconciler.close()
