"""`flashsend dlq replay` for every origin of a dead letter (real Kafka, real PostgreSQL).

- the SNS webhook's letters: origin an SNS topic ARN, value the raw SES notification (JSON,
  not Avro). Replayed, each becomes the `ses_event` records the webhook would have produced,
  on mail.events, keyed by address, with the webhook's headers; the feedback agent's parse
  turns them into the suppression. A letter still unreadable stops the replay, and nothing at
  all is produced (naive version: `--all` produced the JSON bytes to a "topic" named after the
  ARN, or failed half-way);
- the mail service's letters (order.events) go back to their partition with the same key,
  value and the record's own headers;
- campaign letters: tests/integration/test_operations_worker.py
  (test_metrics_move_during_a_campaign_and_dlq_replay_after_the_fix).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from flashsend.cli.entry import main
from flashsend.settings import Settings, settings_env
from producers.dlq import DeadLetter, DeadLetterProducer
from producers.dlq_replay import read_letters
from producers.sns_verify import parse_sns_body
from producers.topics import ensure_topics
from schemas.serde import AvroCodec, registry_client
from streams.feedback_ingest import parse_feedback_record
from tests.integration.mail_fixtures import order_event, wait_for
from tests.integration.ops_helpers import audit_rows, cli

FIXTURE = Path(__file__).parents[1] / "fixtures" / "sns" / "ses_bounce_notification.json"


def read_all(s: Settings, topic: str, timeout: float = 10.0) -> list[Any]:
    consumer = Consumer(
        {
            "bootstrap.servers": s.kafka_bootstrap,
            "group.id": f"t-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        md = consumer.list_topics(topic, timeout=10).topics[topic]
        ends = {}
        for p in md.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while ends and time.monotonic() < deadline:
            for msg in consumer.consume(100, timeout=0.5):
                if msg.error() is not None:
                    continue
                out.append(msg)
                if (msg.offset() or 0) >= ends.get(msg.partition() or 0, 0) - 1:
                    ends.pop(msg.partition() or 0, None)
        return out
    finally:
        consumer.close()


def sns_letter(s: Settings, message: str, reason: str) -> None:
    """A dead letter as the webhook writes one for an authentic but unreadable notification
    (producers/sns_endpoint.py: origin = the topic ARN, key = the SNS MessageId)."""
    msg = parse_sns_body(FIXTURE.read_bytes(), "Notification")
    DeadLetterProducer(s.kafka_bootstrap, s.topic_dlq).publish_blocking(
        [
            DeadLetter(
                msg.topic_arn,
                0,
                0,
                f"{msg.message_id}-{uuid.uuid4().hex[:6]}".encode(),
                message.encode(),
                reason,
                "as the webhook's parser saw it then",
            )
        ]
    )


def test_sns_letters_are_reingested_onto_mail_events_as_the_webhook_would(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    s = settings
    ensure_topics(s.kafka_bootstrap, {s.topic_mail_events: 2, s.topic_dlq: 1})
    notification = json.loads(parse_sns_body(FIXTURE.read_bytes(), "Notification").message)
    sns_letter(s, json.dumps(notification), "no_recipients")  # readable now: the cause is fixed
    unreadable = {**notification, "bounce": {**notification["bounce"], "bouncedRecipients": []}}
    sns_letter(s, json.dumps(unreadable), "no_recipients")  # still unreadable
    wait_for("both letters", lambda: len(read_letters(s)) == 2, timeout=30)

    code, out = cli(s, monkeypatch, capsys, "dlq", "replay", "--all", "--dry-run")
    assert code == 0 and out.count(f"-> {s.topic_mail_events} as the webhook would") == 2, out
    with monkeypatch.context() as m:
        for key, value in settings_env(s).items():
            m.setenv(key, value)
        capsys.readouterr()
        code = main(["dlq", "replay", "--all", "--yes", "--reason", "fixed"])
        err = capsys.readouterr().err
    assert code == 2 and "nothing replayed: these SNS letters are still not readable" in err
    assert "0:1 (no_recipients" in err, err
    assert read_all(s, s.topic_mail_events, timeout=3) == []  # all or nothing
    assert audit_rows(s, "dlq_replays") == []

    code, out = cli(s, monkeypatch, capsys, "dlq", "replay", "0:0", "--yes", "--reason", "fixed")
    assert code == 0, out
    records = read_all(s, s.topic_mail_events)
    recipients = [r["emailAddress"] for r in notification["bounce"]["bouncedRecipients"]]
    assert len(records) == len(recipients) >= 1
    codec = AvroCodec(registry_client(s.schema_registry_url), "ses_event")
    for msg in records:
        headers = dict(msg.headers() or [])
        assert headers["flashsend.schema"] == b"ses_event"
        assert headers["flashsend.replayed_from"] == f"{s.topic_dlq}@0:0".encode()
        effect = parse_feedback_record("ses_event", codec, _Consumed(msg))
        assert not isinstance(effect, DeadLetter), effect
        assert effect.suppress_reason == "bounce" and effect.campaign_id == 42
        assert msg.key() == effect.email.encode()
        assert headers["event_id"] == effect.event_id.encode()
    [row] = audit_rows(s, "dlq_replays")
    assert (row["target_topic"], row["dead_reason"]) == (s.topic_mail_events, "no_recipients")


def test_order_letters_go_back_to_their_partition_as_they_were(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    s = settings
    ensure_topics(s.kafka_bootstrap, {s.topic_order_events: 3, s.topic_dlq: 1})
    codec = AvroCodec(registry_client(s.schema_registry_url), "order_event")
    value = codec.encode(order_event("OrderConfirmed", 77, email="lan@example.com", version=2))
    producer = Producer({"bootstrap.servers": s.kafka_bootstrap})
    producer.produce(
        s.topic_order_events, key=b"77", value=value, partition=2, headers=[("trace", b"t1")]
    )
    assert producer.flush(10) == 0
    [original] = read_all(s, s.topic_order_events)
    # What the mail service's ingest does with it (an unsupported version: poison).
    DeadLetterProducer(s.kafka_bootstrap, s.topic_dlq).publish_blocking(
        [DeadLetter.of(_Consumed(original), "unsupported_version", "OrderConfirmed v2")]
    )
    wait_for("the letter", lambda: read_letters(s), timeout=30)
    code, out = cli(s, monkeypatch, capsys, "dlq", "replay", "--all", "--yes", "--reason", "v2")
    assert code == 0, out
    copies = [m for m in read_all(s, s.topic_order_events) if m.offset() != original.offset()]
    assert len(copies) == 1
    copy = copies[0]
    assert (copy.partition(), copy.key(), copy.value()) == (2, b"77", value)
    assert copy.headers() == [
        ("trace", b"t1"),
        ("flashsend.replayed_from", f"{s.topic_dlq}@0:0".encode()),
    ]
    [row] = audit_rows(s, "dlq_replays")
    assert (row["target_topic"], row["target_partition"], row["new_offset"]) == (
        s.topic_order_events,
        2,
        copy.offset(),
    )


class _Consumed:
    """A confluent-kafka message seen the way DeadLetter.of reads a Faust one."""

    def __init__(self, msg: Any) -> None:
        self.topic, self.partition, self.offset = msg.topic(), msg.partition(), msg.offset()
        self.key, self.value, self.headers = msg.key(), msg.value(), msg.headers()
