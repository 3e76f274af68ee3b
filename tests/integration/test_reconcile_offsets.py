"""The workers' reconciler keeps one client for log-end offsets across ticks; it must still
see records produced after its first question. Its lease scan is one per campaign per quarter
lease, shared by every worker."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from flashsend.settings import Settings
from producers.reconcile import Reconciler
from producers.topics import ensure_topics
from tests.integration.campaign_helpers import pending_seqs, sending_campaign, sql


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


def test_workers_take_turns_at_the_lease_scan(settings: Settings) -> None:
    """The lease scan reads every row of a campaign: the workers' reconcilers share one turn
    per quarter lease (the campaign row's timestamp), not one each."""
    cid = sending_campaign(settings)
    seq, other = pending_seqs(settings, cid)[:2]

    def claim_long_ago(row: int) -> None:
        sql(
            settings,
            "UPDATE campaign_recipients SET status = 'sending', attempts = 1,"
            " claimed_at = now() - interval '1 hour' WHERE campaign_id = %s AND seq = %s",
            cid,
            row,
        )

    def status(row: int) -> str:
        found = sql(
            settings,
            "SELECT status FROM campaign_recipients WHERE campaign_id = %s AND seq = %s",
            cid,
            row,
        )
        return str(found[0][0])

    a, b = Reconciler(settings), Reconciler(settings)
    try:
        claim_long_ago(seq)
        a.reconcile(cid, lease_s=120)  # a reconciler's first tick scans
        assert status(seq) == "pending"
        claim_long_ago(seq)
        b.reconcile(cid, lease_s=120)  # so does b's, whoever scanned last
        assert status(seq) == "pending"
        claim_long_ago(seq)
        a.reconcile(cid, lease_s=120)
        b.reconcile(cid, lease_s=120)
        assert status(seq) == "sending"  # within the quarter lease: nobody's turn
        sql(
            settings,
            "UPDATE campaigns SET leases_checked_at = now() - interval '31 seconds' WHERE id = %s",
            cid,
        )
        claim_long_ago(other)
        b.reconcile(cid, lease_s=120)  # b's turn, however recently b itself scanned
        assert status(seq) == status(other) == "pending"
        claim_long_ago(seq)
        a.reconcile(cid, lease_s=120)  # the turn was b's
        assert status(seq) == "sending"
    finally:
        a.close()
        b.close()
