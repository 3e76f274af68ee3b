"""The Firehose ingest path on real services: SES stand-in (a configuration set's Firehose event
destination, a delivery stream made with boto3) → batched POSTs → the webhook's /firehose →
mail.events (Kafka)."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from pydantic import SecretStr

from flashsend.lab.feedback_run import wait_for, with_feedback
from flashsend.settings import Settings
from infra.process import free_port
from infra.ses_standin.events_admin import SesEventsAdmin
from producers.mail_topics import ensure_mail_topics
from sinks.ses import BulkEntry, SesSender, make_client
from tests.integration.campaign_helpers import put_template
from tests.integration.feedback_helpers import WebhookThread, codec, read_all, total_records

KEY = "fh-standin-key"
FROM = "Sale <sale@news.flashsend.test>"
ROLE = "arn:aws:iam::000000000000:role/flashsend-ses-firehose"
TYPES = ["DELIVERY", "BOUNCE", "COMPLAINT"]


def client(settings: Settings, service: str) -> Any:
    return boto3.session.Session().client(
        service,
        endpoint_url=settings.ses_endpoint_url,
        region_name=settings.ses_region,
        aws_access_key_id=settings.ses_access_key_id,
        aws_secret_access_key=settings.ses_secret_access_key.get_secret_value(),
    )


def firehose_destination(
    settings: Settings, url: str, *, interval_s: int, retry_s: int, gzip: bool
) -> str:
    """A delivery stream to `url` and the marketing configuration set's event destination to
    it; returns the stream's name."""
    name = f"fh-{uuid.uuid4().hex[:8]}"
    arn = client(settings, "firehose").create_delivery_stream(
        DeliveryStreamName=name,
        DeliveryStreamType="DirectPut",
        HttpEndpointDestinationConfiguration={
            "EndpointConfiguration": {"Url": url, "Name": "flashsend", "AccessKey": KEY},
            "BufferingHints": {"SizeInMBs": 1, "IntervalInSeconds": interval_s},
            "RetryOptions": {"DurationInSeconds": retry_s},
            "RequestConfiguration": {"ContentEncoding": "GZIP" if gzip else "NONE"},
            "S3BackupMode": "FailedDataOnly",
            "S3Configuration": {"RoleARN": ROLE, "BucketARN": "arn:aws:s3:::flashsend-backup"},
        },
    )["DeliveryStreamARN"]
    ses = client(settings, "sesv2")
    config_set = settings.marketing_configuration_set
    ses.create_configuration_set(ConfigurationSetName=config_set)
    ses.create_configuration_set_event_destination(
        ConfigurationSetName=config_set,
        EventDestinationName="flashsend-events",
        EventDestination={
            "Enabled": True,
            "MatchingEventTypes": TYPES,
            "KinesisFirehoseDestination": {"IamRoleArn": ROLE, "DeliveryStreamArn": arn},
        },
    )
    return name


def send(settings: Settings, addresses: list[str], campaign: str) -> None:
    """SendBulkEmail through the real client, 50 recipients a call, with the marketing set."""
    put_template(settings)
    ses = SesSender(make_client(settings, timeout=10))
    for start in range(0, len(addresses), 50):
        entries = [BulkEntry(a, {"first_name": "An"}) for a in addresses[start : start + 50]]
        statuses = ses.send_bulk(
            from_address=FROM,
            template="flash_sale",
            entries=entries,
            configuration_set=settings.marketing_configuration_set,
            default_tags={"campaign": campaign},
        )
        assert {s.status for s in statuses} == {"SUCCESS"}


def stream_stats(settings: Settings, name: str) -> dict[str, Any]:
    assert settings.ses_endpoint_url
    return dict(SesEventsAdmin(settings.ses_endpoint_url).firehose()["streams"].get(name, {}))


def expected_events(settings: Settings, campaign: str, addresses: list[str]) -> Counter[Any]:
    """(event type, address) of every event the stand-in decided for these addresses."""
    assert settings.ses_endpoint_url
    injected = SesEventsAdmin(settings.ses_endpoint_url).feedback(campaign)["addresses"]
    bounced, complained = set(injected.get("bounce", [])), set(injected.get("complaint", []))
    out: Counter[Any] = Counter()
    for a in addresses:
        if a in bounced:
            out["Bounce", a] += 1
            continue
        out["Delivery", a] += 1
        if a in complained:
            out["Complaint", a] += 1
    return out


def landed(settings: Settings, expect: int) -> Counter[Any]:
    messages = read_all(settings, settings.topic_mail_events, expect=expect, timeout=60)
    records = [codec(settings, "ses_event").decode(m.value()) for m in messages]
    assert all(r["sns_message_id"].startswith("firehose:") for r in records)
    return Counter((r["event_type"], r["recipient"]) for r in records)


@pytest.fixture
def fh_settings(settings: Settings) -> Settings:
    s = with_feedback(settings, firehose_access_keys=SecretStr(KEY))
    ensure_mail_topics(s)
    assert s.ses_endpoint_url
    SesEventsAdmin(s.ses_endpoint_url).set_rates(
        configuration_set=s.marketing_configuration_set, p_bounce=0.1, p_complaint=0.05, salt="fh"
    )
    return s


@pytest.fixture
def webhook(fh_settings: Settings) -> Iterator[WebhookThread]:
    thread = WebhookThread(fh_settings, relay=False)
    yield thread
    thread.stop()


def test_a_bulk_send_lands_every_event_on_mail_events_in_batches(
    fh_settings: Settings, webhook: WebhookThread
) -> None:
    s = fh_settings
    stream = firehose_destination(s, webhook.url + "/firehose", interval_s=1, retry_s=60, gzip=True)
    domain = f"fh-{uuid.uuid4().hex[:6]}.flashsend.test"
    addresses = [f"u{i}@{domain}" for i in range(300)]
    send(s, addresses, campaign="5151")
    expected = expected_events(s, "5151", addresses)
    kinds = Counter(kind for kind, _ in expected.elements())
    assert kinds["Bounce"] >= 10 and kinds["Complaint"] >= 5, kinds  # ~10 % and ~5 % of 300

    assert landed(s, sum(expected.values())) == expected
    wait_for(  # its statistics come from the emitter twice a second
        "the stand-in sees every request delivered",
        lambda: stream_stats(s, stream).get("delivered_records") == sum(expected.values()),
        10,
    )
    stats = stream_stats(s, stream)
    assert stats["dropped_records"] == 0
    requests = webhook.runtime.firehose.stats["delivered"]  # acknowledged by the webhook
    assert sum(expected.values()) >= 10 * max(requests, stats["delivered_requests"]), stats
    assert stats["largest_request"] >= 50


def test_the_standin_retries_while_the_webhook_is_down_and_loses_nothing(
    fh_settings: Settings,
) -> None:
    s = fh_settings  # its webhook port has nothing listening yet
    url = f"http://127.0.0.1:{s.webhook_port}/firehose"
    stream = firehose_destination(s, url, interval_s=0, retry_s=120, gzip=False)
    domain = f"fh-{uuid.uuid4().hex[:6]}.flashsend.test"
    addresses = [f"d{i}@{domain}" for i in range(100)]
    send(s, addresses, campaign="5252")
    expected = expected_events(s, "5252", addresses)
    wait_for(
        "failed attempts retried",
        lambda: stream_stats(s, stream).get("retried_requests", 0) >= 5,
        30,
    )
    assert total_records(s, s.topic_mail_events) == 0
    webhook = WebhookThread(s, relay=False)
    try:
        assert landed(s, sum(expected.values())) == expected
        wait_for(
            "the stand-in sees every request delivered",
            lambda: stream_stats(s, stream).get("delivered_records") == sum(expected.values()),
            30,
        )
    finally:
        webhook.stop()
    assert stream_stats(s, stream)["dropped_records"] == 0


def test_records_are_dropped_and_counted_once_the_retry_duration_is_over(
    fh_settings: Settings,
) -> None:
    s = fh_settings
    url = f"http://127.0.0.1:{free_port()}/firehose"  # never answers
    stream = firehose_destination(s, url, interval_s=0, retry_s=1, gzip=False)
    addresses = [f"x{i}@fh-{uuid.uuid4().hex[:6]}.flashsend.test" for i in range(20)]
    send(s, addresses, campaign="5353")
    total = sum(expected_events(s, "5353", addresses).values())
    wait_for(
        "every record dropped",
        lambda: stream_stats(s, stream).get("dropped_records") == total,
        30,
    )
    stats = stream_stats(s, stream)
    assert stats["delivered_records"] == 0 and stats["retried_requests"] >= 1
    assert stats["buffered"] == stats["in_flight"] == 0


def test_aws_apply_sets_up_the_firehose_path_at_the_standin_idempotently(
    fh_settings: Settings,
) -> None:
    from infra.aws_apply import apply, clients, desired_for, plan_json, read_current
    from infra.aws_plan import plan

    suffix = uuid.uuid4().hex[:6]
    s = fh_settings.model_copy(
        update={
            "transactional_configuration_set": f"transactional-{suffix}",
            "firehose_stream": f"flashsend-events-{suffix}",
            "firehose_buffer_s": 1,
        }
    )
    d = desired_for(s, "firehose")
    c = clients(s)
    before, after = apply(d, c, log=lambda _m: None)
    assert before.changes == 5 and after.changes == 0  # stream, 2 sets, 2 destinations
    assert KEY not in str(plan_json(before))
    again, _ = apply(d, c, log=lambda _m: None)
    assert again.changes == 0 and again.up_to_date

    http = c.firehose.describe_delivery_stream(DeliveryStreamName=s.firehose_stream)[
        "DeliveryStreamDescription"
    ]["Destinations"][0]["HttpEndpointDestinationDescription"]
    assert http["EndpointConfiguration"]["Url"] == f"http://127.0.0.1:{s.webhook_port}/firehose"
    assert http["RetryOptions"] == {"DurationInSeconds": 7200}
    assert http["RequestConfiguration"]["ContentEncoding"] == "GZIP"
    for name in d.configuration_sets:
        [dest] = c.ses.get_configuration_set_event_destinations(ConfigurationSetName=name)[
            "EventDestinations"
        ]
        assert dest["KinesisFirehoseDestination"]["DeliveryStreamArn"].endswith(
            "/" + s.firehose_stream
        )

    # End to end through what apply made: mail of the marketing set reaches the webhook.
    webhook = WebhookThread(s, relay=False)
    try:
        addresses = [f"a{i}@fh-{suffix}.flashsend.test" for i in range(20)]
        send(s, addresses, campaign="5454")
        expected = expected_events(s, "5454", addresses)
        assert landed(s, sum(expected.values())) == expected
    finally:
        webhook.stop()

    # A rotated key: the stream is given the new first key, then nothing is left to do.
    rotated = s.model_copy(update={"firehose_access_keys": SecretStr(f"new-{KEY},{KEY}")})
    d2 = desired_for(rotated, "firehose")
    changes = plan(d2, read_current(d2, c)).actions
    assert [a.operation for a in changes] == ["update_destination", "tag_delivery_stream"]
    _, left = apply(d2, c, log=lambda _m: None)
    assert left.changes == 0


class NoSuchThing:
    """AWS's IAM and S3 (not emulated here) answering that nothing exists."""

    def get_role(self, RoleName: str) -> Any:
        raise ClientError({"Error": {"Code": "NoSuchEntity"}}, "GetRole")

    def head_bucket(self, **_kw: Any) -> Any:
        raise ClientError({"Error": {"Code": "404"}}, "HeadBucket")


def test_aws_apply_stops_before_any_change_when_a_role_or_the_bucket_is_missing(
    fh_settings: Settings,
) -> None:
    from infra.aws_apply import AwsSetupError, apply, clients, desired_for

    s = fh_settings.model_copy(update={"firehose_stream": f"fh-{uuid.uuid4().hex[:6]}"})
    d = desired_for(s, "firehose")
    c = clients(s)
    c.iam = c.s3 = NoSuchThing()
    with pytest.raises(AwsSetupError, match="does not make IAM roles or S3 buckets") as stopped:
        apply(d, c, log=lambda _m: None)
    assert d.firehose is not None and d.firehose.bucket_arn in str(stopped.value)
    assert s.firehose_stream not in c.firehose.list_delivery_streams()["DeliveryStreamNames"]


class WrongAnswers:
    """An endpoint answering every delivery 200 without echoing its requestId, counting them."""

    def __init__(self) -> None:
        self.requests = 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                endpoint.requests += 1
                body = b'{"requestId": "not-yours", "timestamp": 0}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/firehose"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_200_that_does_not_echo_the_request_id_is_not_a_delivery(fh_settings: Settings) -> None:
    s = fh_settings
    endpoint = WrongAnswers()
    try:
        stream = firehose_destination(s, endpoint.url, interval_s=0, retry_s=1, gzip=False)
        addresses = [f"w{i}@fh-{uuid.uuid4().hex[:6]}.flashsend.test" for i in range(10)]
        send(s, addresses, campaign="5555")
        total = sum(expected_events(s, "5555", addresses).values())
        wait_for(
            "every record dropped",
            lambda: stream_stats(s, stream).get("dropped_records") == total,
            30,
        )
        assert stream_stats(s, stream)["delivered_records"] == 0
        assert endpoint.requests >= 2  # tried again before giving up
    finally:
        endpoint.close()


def test_flashsend_up_on_the_firehose_path_delivers_each_event_once(fh_settings: Settings) -> None:
    """`up` with FLASHSEND_EVENTS_INGEST=firehose makes the stream and the destinations at the
    stand-in and subscribes the webhook over SNS for SMS events only: an SES event reaches
    mail.events once, through /firehose (the stack's broker and stand-in already run)."""
    from infra.stack import Stack

    suffix = uuid.uuid4().hex[:6]
    s = fh_settings.model_copy(
        update={
            "events_ingest": "firehose",
            "local_services": ("kafka", "ses", "webhook"),
            "transactional_configuration_set": f"transactional-{suffix}",
            "firehose_stream": f"up-{suffix}",
            "firehose_buffer_s": 1,
        }
    )
    stack = Stack(s)
    lines: list[str] = []
    try:
        timings = stack.up(migrate=False, log=lines.append)
        assert timings["webhook"] > 0, lines
        addresses = [f"up{i}@fh-{suffix}.flashsend.test" for i in range(30)]
        send(s, addresses, campaign="5656")
        expected = expected_events(s, "5656", addresses)
        assert landed(s, sum(expected.values())) == expected
        wait_for(
            "the stand-in sees every request delivered",
            lambda: (
                stream_stats(s, s.firehose_stream).get("delivered_records")
                == sum(expected.values())
            ),
            10,
        )
        assert s.ses_endpoint_url
        subs = SesEventsAdmin(s.ses_endpoint_url).subscriptions()["subscriptions"]
        ours = [x for x in subs if x["endpoint"].startswith(f"http://127.0.0.1:{s.webhook_port}/")]
        assert [x["configuration_sets"] for x in ours] == [[s.sms_configuration_set]]
        assert total_records(s, s.topic_mail_events) == sum(expected.values())  # once each
    finally:
        assert stack.webhook.stop()
