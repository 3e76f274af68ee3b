"""The SES stand-in over HTTP, driven by the real boto3 sesv2 client."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

from infra.ses_standin.faults import FaultConfig
from tests.integration.ses_helpers import StandinProcess, start_standin

SENDER = "Shop <shop@example.com>"
DEFAULTS = FaultConfig().to_dict()


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandinProcess]:
    process = start_standin(tmp_path_factory.mktemp("ses") / "state")
    yield process
    process.stop()


@pytest.fixture
def ses(standin: StandinProcess) -> Iterator[StandinProcess]:
    """The shared stand-in, with no messages, no templates and default settings."""
    standin.admin.reset(templates=True)
    standin.admin.set_faults(**DEFAULTS)
    yield standin


def entry(address: str, data: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"Destination": {"ToAddresses": [address]}, **extra}
    if data is not None:
        item["ReplacementEmailContent"] = {
            "ReplacementTemplate": {"ReplacementTemplateData": json.dumps(data)}
        }
    return item


def send_bulk(
    client: Any,
    entries: list[dict[str, Any]],
    campaign: str = "c1",
    template: str = "promo",
    default_data: dict[str, Any] | None = None,
    **extra: Any,
) -> list[dict[str, Any]]:
    response = client.send_bulk_email(
        FromEmailAddress=SENDER,
        DefaultContent={
            "Template": {"TemplateName": template, "TemplateData": json.dumps(default_data or {})}
        },
        DefaultEmailTags=[{"Name": "campaign", "Value": campaign}],
        BulkEmailEntries=entries,
        **extra,
    )
    results: list[dict[str, Any]] = response["BulkEmailEntryResults"]
    return results


def addresses(n: int, prefix: str = "u") -> list[dict[str, Any]]:
    return [entry(f"{prefix}{i}@example.com", {"name": f"N{i}"}) for i in range(n)]


def make_template(client: Any, name: str = "promo") -> None:
    client.create_email_template(
        TemplateName=name,
        TemplateContent={
            "Subject": "Hi {{name}}, {{shop}} sale",
            "Text": "Hello {{name}}",
            "Html": "<p>Hello {{name}}</p>",
        },
    )


def error_code(exc: pytest.ExceptionInfo[ClientError]) -> str:
    return str(exc.value.response["Error"]["Code"])


def test_template_lifecycle(ses: StandinProcess) -> None:
    client = ses.client()
    make_template(client, "a-promo")
    make_template(client, "b_promo")
    got = client.get_email_template(TemplateName="a-promo")
    assert got["TemplateName"] == "a-promo"
    assert got["TemplateContent"]["Subject"] == "Hi {{name}}, {{shop}} sale"

    first = client.list_email_templates(PageSize=1)
    assert [t["TemplateName"] for t in first["TemplatesMetadata"]] == ["a-promo"]
    assert first["TemplatesMetadata"][0]["CreatedTimestamp"].year >= 2024
    second = client.list_email_templates(PageSize=1, NextToken=first["NextToken"])
    assert [t["TemplateName"] for t in second["TemplatesMetadata"]] == ["b_promo"]
    assert "NextToken" not in second

    with pytest.raises(ClientError) as exists:
        make_template(client, "a-promo")
    assert error_code(exists) == "AlreadyExistsException"

    client.update_email_template(
        TemplateName="a-promo", TemplateContent={"Subject": "New {{name}}", "Text": "t"}
    )
    assert client.get_email_template(TemplateName="a-promo")["TemplateContent"] == {
        "Subject": "New {{name}}",
        "Text": "t",
    }
    client.delete_email_template(TemplateName="a-promo")
    with pytest.raises(client.exceptions.NotFoundException):
        client.get_email_template(TemplateName="a-promo")
    with pytest.raises(ClientError) as missing:
        client.delete_email_template(TemplateName="a-promo")
    assert error_code(missing) == "NotFoundException"
    assert missing.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_bulk_send_renders_and_records(ses: StandinProcess) -> None:
    client = ses.client()
    make_template(client)
    entries = [
        entry(
            "alice@example.com",
            {"name": "Alice"},
            ReplacementTags=[{"Name": "seq", "Value": "1"}],
            ReplacementHeaders=[{"Name": "List-Unsubscribe", "Value": "<https://u.test/1>"}],
        ),
        entry("Bob <BOB@Example.com>", {"name": "Bob", "shop": "Outlet"}),
    ]
    results = send_bulk(
        client,
        entries,
        campaign="42",
        default_data={"shop": "Flash", "name": "friend"},
        ConfigurationSetName="marketing",
    )
    assert [r["Status"] for r in results] == ["SUCCESS", "SUCCESS"]
    assert len({r["MessageId"] for r in results}) == 2

    records = ses.admin.messages(campaign="42")
    assert [r["message_id"] for r in records] == [r["MessageId"] for r in results]
    alice, bob = records
    assert alice["subject"] == "Hi Alice, Flash sale"
    assert alice["destination"] == ["alice@example.com"]
    assert alice["tags"] == {"campaign": "42", "seq": "1"}
    assert alice["headers"] == {"List-Unsubscribe": "<https://u.test/1>"}
    assert alice["template"] == "promo"
    assert alice["from"] == SENDER
    assert alice["configuration_set"] == "marketing"
    assert alice["operation"] == "bulk"
    assert alice["rendering_failure"] is None
    assert bob["subject"] == "Hi Bob, Outlet sale"
    # Lookup by destination uses the bare, case-folded address.
    assert [r["message_id"] for r in ses.admin.messages(destination="bob@example.com")] == [
        bob["message_id"]
    ]
    stats = ses.admin.stats("42")
    assert stats["accepted"] == 2
    assert stats["duplicates"] == 0


def test_missing_variable_is_accepted_as_rendering_failure(ses: StandinProcess) -> None:
    client = ses.client()
    make_template(client)
    results = send_bulk(client, [entry("a@example.com", {"name": "A"})])
    assert results[0]["Status"] == "SUCCESS"
    record = ses.admin.messages(campaign="c1")[0]
    assert record["rendering_failure"] == "Attribute 'shop' is not present in the rendering data."
    assert ses.admin.stats("c1")["rendering_failures"] == 1


@pytest.mark.parametrize("count", [0, 51])
def test_entry_count_limits(ses: StandinProcess, count: int) -> None:
    client = ses.client()
    make_template(client)
    with pytest.raises(ClientError) as exc:
        send_bulk(client, addresses(count))
    assert error_code(exc) == "BadRequestException"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert ses.admin.stats()["accepted"] == 0


def test_fifty_entries_accepted(ses: StandinProcess) -> None:
    client = ses.client()
    make_template(client)
    results = send_bulk(client, addresses(50), default_data={"shop": "S"})
    assert {r["Status"] for r in results} == {"SUCCESS"}
    assert ses.admin.stats("c1")["accepted"] == 50


@pytest.mark.parametrize(
    "mutation",
    [
        pytest.param({"ReplacementTags": [{"Name": "campaign id", "Value": "1"}]}, id="tag-space"),
        pytest.param({"ReplacementTags": [{"Name": "seq", "Value": "a:b"}]}, id="tag-colon"),
        pytest.param({"ReplacementTags": [{"Name": "seq", "Value": ""}]}, id="tag-empty"),
        pytest.param({"ReplacementTags": [{"Name": "x" * 257, "Value": "1"}]}, id="tag-long"),
        pytest.param(
            {"ReplacementHeaders": [{"Name": f"X-H{i}", "Value": "v"} for i in range(16)]},
            id="16-headers",
        ),
        pytest.param(
            {
                "ReplacementEmailContent": {
                    "ReplacementTemplate": {"ReplacementTemplateData": "{not json"}
                }
            },
            id="bad-json",
        ),
        pytest.param({"Destination": {"ToAddresses": ["not-an-address"]}}, id="bad-address"),
        pytest.param({"Destination": {}}, id="no-recipient"),
    ],
)
def test_invalid_entry_rejects_whole_call(ses: StandinProcess, mutation: dict[str, Any]) -> None:
    # parameter_validation off: botocore itself refuses some of these (16 headers) client-side.
    client = ses.client(validate=False)
    make_template(client)
    entries = addresses(3)
    entries[1] = {**entries[1], **mutation}
    with pytest.raises(ClientError) as exc:
        send_bulk(client, entries)
    assert error_code(exc) == "BadRequestException"
    assert ses.admin.stats()["accepted"] == 0


def test_missing_from_address_is_bad_request(ses: StandinProcess) -> None:
    client = ses.client()
    make_template(client)
    with pytest.raises(ClientError) as exc:
        client.send_bulk_email(
            DefaultContent={"Template": {"TemplateName": "promo"}},
            BulkEmailEntries=addresses(1),
        )
    assert error_code(exc) == "BadRequestException"


def test_template_not_found_is_per_entry(ses: StandinProcess) -> None:
    results = send_bulk(ses.client(), addresses(3), template="nope")
    assert [r["Status"] for r in results] == ["TEMPLATE_NOT_FOUND"] * 3
    assert all("MessageId" not in r for r in results)
    assert ses.admin.stats()["accepted"] == 0


def test_rate_limit_counts_recipients(ses: StandinProcess) -> None:
    client = ses.client()
    make_template(client)
    ses.admin.set_faults(max_send_rate=10)
    with pytest.raises(ClientError) as too_many:
        send_bulk(client, addresses(11))
    assert error_code(too_many) == "TooManyRequestsException"
    assert too_many.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert ses.admin.stats()["accepted"] == 0

    assert len(send_bulk(client, addresses(10))) == 10  # a full bucket is 1 s worth
    with pytest.raises(ClientError) as drained:  # 9 tokens take 0.9 s to come back
        send_bulk(client, addresses(9, "v"))
    assert error_code(drained) == "TooManyRequestsException"
    assert ses.admin.stats()["accepted"] == 10
    time.sleep(1.0)  # refills 10/s: 10 tokens now
    assert len(send_bulk(client, addresses(9, "w"))) == 9


def test_random_429(ses: StandinProcess) -> None:
    client = ses.client()
    make_template(client)
    ses.admin.set_faults(p429=1.0)
    with pytest.raises(ClientError) as exc:
        send_bulk(client, addresses(2))
    assert error_code(exc) == "TooManyRequestsException"
    assert ses.admin.stats()["accepted"] == 0


def test_transient_failures_are_not_recorded(ses: StandinProcess) -> None:
    client = ses.client()
    make_template(client)
    ses.admin.set_faults(p_transient=1.0)
    results = send_bulk(client, addresses(5))
    assert [r["Status"] for r in results] == ["TRANSIENT_FAILURE"] * 5
    with pytest.raises(ClientError) as single:  # SendEmail has no entries: a 500 instead
        client.send_email(
            FromEmailAddress=SENDER,
            Destination={"ToAddresses": ["x@example.com"]},
            Content={"Simple": {"Subject": {"Data": "s"}, "Body": {"Text": {"Data": "b"}}}},
        )
    assert error_code(single) == "InternalFailure"
    assert single.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert ses.admin.stats()["accepted"] == 0


def test_hang_records_then_times_out(ses: StandinProcess) -> None:
    client = ses.client(read_timeout=1)
    make_template(client)
    ses.admin.set_faults(p_hang=1.0)
    started = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        send_bulk(client, addresses(4))
    assert time.monotonic() - started >= 1.0
    stats = ses.admin.stats("c1")
    assert stats["accepted"] == 4  # accepted although the client never saw an answer
    # A client that waits longer than hang_max_s sees the connection dropped, no answer.
    ses.admin.set_faults(hang_max_s=0.3)
    with pytest.raises(ConnectionClosedError):
        send_bulk(ses.client(read_timeout=10), addresses(2, "late"))
    assert ses.admin.stats("c1")["accepted"] == 6
    ses.admin.set_faults(p_hang=0.0)
    assert len(send_bulk(client, addresses(1, "after"))) == 1


def test_botocore_max_attempts_1_still_retries_a_hung_send(ses: StandinProcess) -> None:
    """Guard (SDK retries off): `{"max_attempts": 1}` is one *retry*, so a hang sends twice."""
    client = boto3.client(
        "sesv2",
        endpoint_url=ses.url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=Config(retries={"max_attempts": 1}, read_timeout=1),
    )
    assert client.meta.config.retries["total_max_attempts"] == 2
    make_template(client)
    ses.admin.set_faults(p_hang=1.0)
    with pytest.raises(ReadTimeoutError):
        send_bulk(client, addresses(3))
    stats = ses.admin.stats("c1")
    assert stats["accepted"] == 6
    assert stats["duplicates"] == 3


def test_latency_is_added(ses: StandinProcess) -> None:
    client = ses.client()
    ses.admin.set_faults(latency_ms=300, jitter_ms=50)
    started = time.monotonic()
    client.get_account()
    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 2.0


def test_duplicates_per_campaign(ses: StandinProcess) -> None:
    client = ses.client()
    make_template(client)
    send_bulk(client, [entry("dup@example.com"), entry("once@example.com")], campaign="d")
    send_bulk(client, [entry("DUP@example.com")], campaign="d")
    send_bulk(client, [entry("dup@example.com")], campaign="other")  # other campaign: no dup
    stats = ses.admin.stats("d")
    assert stats["accepted"] == 3
    assert stats["duplicates"] == 1
    assert stats["duplicate_destinations"] == ["dup@example.com"]
    overall = ses.admin.stats()
    assert overall["accepted"] == 4
    assert overall["duplicates"] == 1


def test_sliding_window_is_exact(ses: StandinProcess) -> None:
    client = ses.client()
    make_template(client)
    # Three bursts of 10, 0.6 s apart: any 1 s window holds two of them, never three.
    for burst in range(3):
        if burst:
            time.sleep(0.6)
        send_bulk(client, addresses(10, f"b{burst}-"), campaign="w")
    stats = ses.admin.stats("w")
    times = sorted(r["time"] for r in ses.admin.messages(campaign="w", limit=1000))
    brute = max(sum(1 for u in times if t <= u < t + 1.0) for t in times)
    assert stats["max_1s_window"] == brute == 20
    assert stats["accepted"] == 30
    assert stats["first_ts"] == times[0]
    assert stats["last_ts"] == times[-1]
    rows = ses.admin.rate("w", bucket_ms=100)
    assert sum(n for _, n in rows) == 30
    assert rows[0][1] == 10 and rows[-1][1] == 10


def test_account_quota_fields_and_daily_quota(ses: StandinProcess) -> None:
    client = ses.client()
    make_template(client)
    unlimited = client.get_account()
    assert unlimited["SendQuota"] == {
        "Max24HourSend": -1.0,
        "MaxSendRate": -1.0,
        "SentLast24Hours": 0.0,
    }
    assert unlimited["ProductionAccessEnabled"] is True
    assert unlimited["SendingEnabled"] is True

    ses.admin.set_faults(max_send_rate=14, max_24h_send=3)
    results = send_bulk(client, addresses(5))
    assert [r["Status"] for r in results] == ["SUCCESS"] * 3 + ["ACCOUNT_DAILY_QUOTA_EXCEEDED"] * 2
    quota = client.get_account()["SendQuota"]
    assert quota == {"Max24HourSend": 3.0, "MaxSendRate": 14.0, "SentLast24Hours": 3.0}
    with pytest.raises(ClientError) as exc:
        client.send_email(
            FromEmailAddress=SENDER,
            Destination={"ToAddresses": ["x@example.com"]},
            Content={"Template": {"TemplateName": "promo", "TemplateData": "{}"}},
        )
    assert error_code(exc) == "LimitExceededException"
    assert "Daily message quota exceeded" in exc.value.response["Error"]["Message"]


def test_sending_paused(ses: StandinProcess) -> None:
    client = ses.client()
    make_template(client)
    ses.admin.set_faults(sending_enabled=False)
    assert [r["Status"] for r in send_bulk(client, addresses(2))] == ["ACCOUNT_SENDING_PAUSED"] * 2
    with pytest.raises(ClientError) as exc:
        client.send_email(
            FromEmailAddress=SENDER,
            Destination={"ToAddresses": ["x@example.com"]},
            Content={"Simple": {"Subject": {"Data": "s"}, "Body": {"Text": {"Data": "b"}}}},
        )
    assert error_code(exc) == "SendingPausedException"
    assert client.get_account()["SendingEnabled"] is False


def test_send_email_simple_template_and_raw(ses: StandinProcess) -> None:
    client = ses.client()
    make_template(client)
    simple = client.send_email(
        FromEmailAddress=SENDER,
        Destination={"ToAddresses": ["a@example.com"], "CcAddresses": ["c@example.com"]},
        Content={"Simple": {"Subject": {"Data": "Order 1"}, "Body": {"Text": {"Data": "ok"}}}},
        EmailTags=[{"Name": "kind", "Value": "order"}],
    )["MessageId"]
    templated = client.send_email(
        FromEmailAddress=SENDER,
        Destination={"ToAddresses": ["b@example.com"]},
        Content={
            "Template": {
                "TemplateName": "promo",
                "TemplateData": json.dumps({"name": "B", "shop": "S"}),
            }
        },
    )["MessageId"]
    raw_mime = b"From: shop@example.com\r\nTo: r@example.com\r\nSubject: Raw one\r\n\r\nbody\r\n"
    raw = client.send_email(Content={"Raw": {"Data": raw_mime}})["MessageId"]
    by_id = {r["message_id"]: r for r in ses.admin.messages(limit=10)}
    assert by_id[simple]["subject"] == "Order 1"
    assert by_id[simple]["cc"] == ["c@example.com"]
    assert by_id[simple]["operation"] == "single"
    assert by_id[simple]["tags"] == {"kind": "order"}
    assert by_id[templated]["subject"] == "Hi B, S sale"
    assert by_id[raw]["destination"] == ["r@example.com"]
    assert by_id[raw]["subject"] == "Raw one"
    assert ses.admin.stats()["accepted"] == 4
    with pytest.raises(ClientError) as missing:
        client.send_email(
            FromEmailAddress=SENDER,
            Destination={"ToAddresses": ["b@example.com"]},
            Content={"Template": {"TemplateName": "nope", "TemplateData": "{}"}},
        )
    assert error_code(missing) == "NotFoundException"
    assert base64.b64encode(raw_mime)  # the client base64-encodes blobs itself


def test_admin_faults_roundtrip(ses: StandinProcess) -> None:
    updated = ses.admin.set_faults(p_transient=0.25, latency_ms=5)
    assert updated["p_transient"] == 0.25
    assert updated["latency_ms"] == 5.0
    assert ses.admin.faults() == updated
    with pytest.raises(Exception, match="probability"):
        ses.admin.set_faults(p_hang=2)


def test_journal_survives_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = start_standin(state, "--max-send-rate", "1000")
    try:
        client = first.client()
        make_template(client)
        sent = send_bulk(client, addresses(7), campaign="r", default_data={"shop": "S"})
        send_bulk(client, [entry("u0@example.com", {"name": "again"})], campaign="r")
        before = first.admin.stats("r")
    finally:
        first.stop()
    assert first.process.returncode == 0

    second = start_standin(state)
    try:
        after = second.admin.stats("r")
        assert {k: v for k, v in after.items() if k != "now"} == {
            k: v for k, v in before.items() if k != "now"
        }  # `now` is the stand-in's clock when it answered
        assert before["now"] <= after["now"]
        assert after["accepted"] == 8
        assert after["duplicates"] == 1
        ids = [r["message_id"] for r in second.admin.messages(campaign="r", limit=8)]
        assert ids[:7] == [r["MessageId"] for r in sent]
        client = second.client()
        assert client.get_account()["SendQuota"]["SentLast24Hours"] == 8.0
        assert client.get_email_template(TemplateName="promo")["TemplateName"] == "promo"
        send_bulk(client, [entry("new@example.com", {"name": "N"})], campaign="r")
        assert second.admin.stats("r")["accepted"] == 9
    finally:
        second.stop()
