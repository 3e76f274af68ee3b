"""The SQS ingest path on real services: SES stand-in → ElasticMQ → `flashsend events pull` →
mail.events (Kafka) → feedback worker → PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from flashsend.lab.feedback_run import WebhookProcess, feedback_lag, suppressed, wait_for
from flashsend.lab.sqs_run import PullerProcess, queue_depth, wait_queue_empty
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from infra.aws_apply import ensure_local_queues
from infra.process import free_port
from infra.ses_standin.events_admin import SesEventsAdmin
from infra.ses_standin.sqs_admin import SqsSinkAdmin
from producers.dlq import DeadLetterProducer, read_dead_letters
from producers.event_publisher import EventPublisher
from producers.mail_topics import ensure_mail_topics
from producers.ses_events import SCHEMA
from producers.sqs_client import SqsClient, boto3_sqs, queue_url
from producers.sqs_puller import BrokerGate, PullerConfig, SqsPuller
from schemas.serde import AvroCodec, registry_client
from sinks.ses import BulkEntry, SesSender, make_client
from tests.integration.campaign_helpers import put_template
from tests.integration.feedback_helpers import codec, header, read_all, total_records

FROM = "Sale <sale@news.flashsend.test>"


def send(settings: Settings, addresses: list[str], campaign: str = "4242") -> None:
    """SendBulkEmail through the real client, 50 recipients a call, with the marketing set."""
    put_template(settings)
    ses = SesSender(make_client(settings, timeout=10))
    for start in range(0, len(addresses), 50):
        chunk = addresses[start : start + 50]
        entries = [
            BulkEntry(a, {"first_name": "An"}, tags={"seq": str(i)}) for i, a in enumerate(chunk)
        ]
        statuses = ses.send_bulk(
            from_address=FROM,
            template="flash_sale",
            entries=entries,
            configuration_set=settings.marketing_configuration_set,
            default_tags={"campaign": campaign},
        )
        assert {s.status for s in statuses} == {"SUCCESS"}


def sink(settings: Settings) -> SqsSinkAdmin:
    assert settings.ses_endpoint_url
    return SqsSinkAdmin(settings.ses_endpoint_url)


def test_bounces_and_complaints_reach_the_suppression_table_through_sqs(
    sqs_settings: Settings, tmp_path: Path
) -> None:
    s = sqs_settings
    done = ensure_local_queues(s)  # the queues and the stand-in's raw SQS subscription
    assert any("subscribe queue" in line for line in done), done
    assert ensure_local_queues(s) == []  # idempotent
    assert s.ses_endpoint_url
    SesEventsAdmin(s.ses_endpoint_url).set_rates(
        configuration_set=s.marketing_configuration_set, p_bounce=0.1, p_complaint=0.05, salt="q"
    )
    domain = f"sqs-{uuid.uuid4().hex[:6]}.flashsend.test"
    addresses = [f"u{i}@{domain}" for i in range(300)]
    ensure_mail_topics(s)
    puller = PullerProcess.start(s, tmp_path, pullers=2)
    feedback = WorkerPool(s, tmp_path, loglevel="info", role="feedback")
    feedback.start(1)
    try:
        send(s, addresses)
        state = sink(s).wait_drained(timeout=60)
        wait_queue_empty(s, timeout=60)
        wait_for("feedback group caught up", lambda: feedback_lag(s) == 0, 90)
        injected = sink(s).feedback("4242")["addresses"]
        expected = {a: "bounce" for a in injected.get("bounce", []) if a.endswith(domain)}
        expected |= {a: "complaint" for a in injected.get("complaint", []) if a.endswith(domain)}
        assert 15 <= len(expected) <= 75, injected  # ~10 % + ~5 % of 300
        assert suppressed(s) == expected
        # Nothing lost, nothing doubled on the way: one record per event the stand-in queued.
        [sub] = [x for x in state["subscriptions"] if x["queue_url"].endswith(s.sqs_queue)]
        assert sub["delivery"]["delivered"] == total_records(s, s.topic_mail_events) > 600
    finally:
        summary = puller.stop()
        feedback.stop()
    assert summary["deleted"] == summary["received"] == summary["published"] > 600


def test_poison_is_dead_lettered_and_deleted(sqs_settings: Settings, tmp_path: Path) -> None:
    s = sqs_settings
    ensure_local_queues(s)
    ensure_mail_topics(s)
    url = queue_url(s)
    envelope = json.dumps({"Type": "Notification", "TopicArn": "arn:x", "Message": "{}"})
    boto3_sqs(s).send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": "1", "MessageBody": "not json"}, {"Id": "2", "MessageBody": envelope}],
    )
    puller = PullerProcess.start(s, tmp_path, pullers=1)
    try:
        wait_queue_empty(s, timeout=30)
    finally:
        summary = puller.stop()
    letters = read_dead_letters(s.kafka_bootstrap, s.topic_dlq, limit=10)
    assert sorted(x["reason"] for x in letters) == ["not_json", "not_raw_delivery"]
    assert {x["topic"] for x in letters} == {url}
    assert total_records(s, s.topic_mail_events) == 0
    assert summary["deleted"] == 2 and summary["dead:not_json"] == 1


def test_the_puller_publishes_the_records_the_webhook_publishes(
    sqs_settings: Settings, tmp_path: Path
) -> None:
    """The stand-in delivers the same events both ways (signed SNS POST to the webhook, raw
    body into SQS); the records on mail.events are equal but for when and how they came."""
    s = sqs_settings
    ensure_local_queues(s)
    ensure_mail_topics(s)
    assert s.ses_endpoint_url
    events = SesEventsAdmin(s.ses_endpoint_url)
    events.set_rates(configuration_set=s.marketing_configuration_set, p_bounce=0.5, salt="w")
    webhook = WebhookProcess.start(s, tmp_path)
    sub = events.subscribe(
        webhook.sns_url, s.sns_topic_arns[0], configuration_sets=[s.marketing_configuration_set]
    )
    puller = PullerProcess.start(s, tmp_path, pullers=1)
    try:
        events.wait_confirmed(sub["id"])
        send(s, [f"w{i}@{uuid.uuid4().hex[:6]}.flashsend.test" for i in range(6)], campaign="77")
        events.wait_drained(timeout=60)
        sink(s).wait_drained(timeout=60)
        wait_queue_empty(s, timeout=60)
        messages = read_all(s, s.topic_mail_events, expect=2 * 6 * 2)
    finally:
        puller.stop()
        webhook.stop()
        events.unsubscribe(sub["id"])
    avro = codec(s, SCHEMA)
    by_path: dict[str, dict[str, Any]] = {"sqs": {}, "sns": {}}
    for m in messages:
        value = avro.decode(m.value())
        path = "sqs" if value["sns_message_id"].startswith("sqs:") else "sns"
        by_path[path][value["event_id"]] = (m.key(), m.headers(), value)
    assert set(by_path["sqs"]) == set(by_path["sns"]) and len(by_path["sqs"]) >= 12
    for event_id, (key, headers, value) in by_path["sqs"].items():
        key2, headers2, value2 = by_path["sns"][event_id]
        assert (key, headers) == (key2, headers2)
        # The stand-in builds each path's copy on its own, stamping a delivery or bounce when
        # it builds it (SNS fans one event out); a Send carries the message's own time.
        ignore = {"sns_message_id", "received_at", "occurred_at"}
        assert {k: v for k, v in value.items() if k not in ignore} == {
            k: v for k, v in value2.items() if k not in ignore
        }
        if value["event_type"] == "Send":
            assert value["occurred_at"] == value2["occurred_at"]
        assert abs(value["occurred_at"] - value2["occurred_at"]) < 5000


def test_messages_stay_in_sqs_while_the_broker_does_not_acknowledge(
    sqs_settings: Settings,
) -> None:
    """A puller whose broker never answers deletes nothing, not even poison it could not
    dead-letter, and stops receiving; another one with a broker then lands every event and
    dead-letters the poison (real SQS server, real broker; the first puller's bootstrap is a
    closed port)."""
    s = sqs_settings
    ensure_local_queues(s)
    ensure_mail_topics(s)
    assert s.ses_endpoint_url
    boto3_sqs(s).send_message(QueueUrl=queue_url(s), MessageBody="{not json")
    send(s, [f"k{i}@{uuid.uuid4().hex[:6]}.flashsend.test" for i in range(10)], campaign="5")
    sink(s).wait_drained(timeout=60)
    queued = queue_depth(s)["waiting"]
    assert queued >= 21  # the poison, a Send and a Delivery per message
    config = PullerConfig(queue_url(s), pullers=2, wait_s=1, visibility_s=5)

    async def run(bootstrap: str, seconds: float) -> SqsPuller:
        sqs = SqsClient.for_settings(s)
        publisher = EventPublisher(bootstrap, s.topic_mail_events, timeout_s=2.0)
        puller = SqsPuller(
            config,
            sqs=sqs,
            publisher=publisher,
            dlq=DeadLetterProducer(bootstrap, s.topic_dlq),
            codec=AvroCodec(registry_client(s.schema_registry_url), SCHEMA),
            gate=BrokerGate(bootstrap, s.topic_mail_events),
        )
        task = asyncio.create_task(puller.run())
        await asyncio.sleep(seconds)
        puller.stop()
        await task
        await sqs.close()
        await asyncio.to_thread(publisher.close, 1.0)
        return puller

    dead = asyncio.run(run(f"127.0.0.1:{free_port()}", 8.0))
    assert dead.stats["publish_failed"] >= 10 and dead.stats["deleted"] == 0
    assert not dead.gate.is_open  # stopped receiving: the receive count stays low
    assert dead.stats["received"] <= 2 * 10  # one batch per puller, then the gate
    assert sum(queue_depth(s).values()) == queued  # all still in SQS
    live = asyncio.run(run(s.kafka_bootstrap, 10.0))
    assert live.stats["deleted"] == queued and live.stats["dead:not_json"] == 1
    assert total_records(s, s.topic_mail_events) == queued - 1
    assert sum(queue_depth(s).values()) == 0
    ids = {header(m, "event_id") for m in read_all(s, s.topic_mail_events, expect=queued - 1)}
    assert len(ids) == queued - 1
    [letter] = read_dead_letters(s.kafka_bootstrap, s.topic_dlq, limit=10)
    assert letter["reason"] == "not_json"


@pytest.mark.parametrize("path", ["sqs", "webhook"])
def test_aws_apply_against_the_stand_in_and_elasticmq_is_idempotent(
    sqs_settings: Settings, path: str
) -> None:
    from infra.aws_apply import apply, clients, desired_for

    s = sqs_settings
    d = desired_for(s, path)
    c = clients(s)
    before, after = apply(d, c, log=lambda _m: None)
    assert before.changes > 0 and after.changes == 0
    again, _ = apply(d, c, log=lambda _m: None)
    assert again.changes == 0 and again.up_to_date
    for name in d.configuration_sets:
        [dest] = c.ses.get_configuration_set_event_destinations(ConfigurationSetName=name)[
            "EventDestinations"
        ]
        assert dest["Name"] == s.aws_events_destination and dest["Enabled"]
        assert "OPEN" not in dest["MatchingEventTypes"]
        assert dest["SnsDestination"]["TopicArn"] == s.sns_topic_arns[0]
    names = {u.rsplit("/", 1)[1] for u in c.sqs.list_queues()["QueueUrls"]}
    assert f"{s.sqs_queue}-sns-dlq" in names
    assert (s.sqs_queue in names) == (path == "sqs")


def test_flashsend_up_with_sqs_and_puller_lands_events(sqs_settings: Settings) -> None:
    """`sqs` and `puller` as local services: `up` makes the queues and the stand-in's
    subscription, starts `events pull`, and mail sent through the stand-in lands on
    mail.events (the stack's broker, stand-in and ElasticMQ were already running)."""
    from infra.stack import Stack

    s = sqs_settings.model_copy(update={"local_services": ("kafka", "ses", "sqs", "puller")})
    ensure_mail_topics(s)
    lines: list[str] = []
    stack = Stack(s)
    try:
        timings = stack.up(migrate=False, log=lines.append)
        assert timings["sqs"] == 0.0 and timings["puller"] > 0, lines
        status = {x.name: x.running for x in stack.status()}
        assert status["sqs"] and status["puller"], status
        send(s, [f"up{i}@{uuid.uuid4().hex[:6]}.flashsend.test" for i in range(5)], campaign="9")
        wait_for("10 records", lambda: total_records(s, s.topic_mail_events) >= 10, 60)
    finally:
        assert stack.puller.stop()
    assert total_records(s, s.topic_mail_events) == 10  # a Send and a Delivery each
