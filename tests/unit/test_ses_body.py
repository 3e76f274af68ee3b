"""The SendBulkEmail body flashsend writes itself (sinks.ses) is the one botocore would write."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from botocore.config import Config

from flashsend.settings import Settings
from sinks.ses import BulkEntry, SesCallFailed, SesSender, make_client

# Shapes whose botocore serialisation is the value itself.
IDENTITY_LEAVES = {"string", "integer", "long", "boolean"}


class Captured(Exception):
    """Stops the call once the signed request is built: nothing goes over the network."""

    def __init__(self, body: bytes, headers: dict[str, str]) -> None:
        super().__init__("captured")
        self.body = body
        self.headers = headers


def capture(request: Any, **_: Any) -> None:
    raise Captured(request.body, dict(request.headers))


def settings() -> Settings:
    return Settings(ses_endpoint="http://127.0.0.1:9", ses_region="us-east-1")


def plain_client(s: Settings) -> Any:
    """A client without flashsend's hooks: botocore serialises the whole request."""
    return boto3.session.Session().client(
        "sesv2",
        endpoint_url=s.ses_endpoint_url,
        region_name=s.ses_region,
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="secret",
        config=Config(parameter_validation=False, retries={"total_max_attempts": 1}),
    )


ENTRIES = [
    BulkEntry(
        to=f"user{i}@example.com",
        replacement_data={
            "first_name": 'Zoë "quoted" \\ <b>',
            "n": i,
            "vip": i % 2 == 0,
            "score": i / 3,
            "nothing": None,
            "list": [1, "ü"],
        },
        headers={
            "List-Unsubscribe": f"<https://u.example/{i}>",
            "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
        },
        tags={"campaign": "42", "seq": str(i)},
    )
    for i in range(48)
] + [BulkEntry("bare@example.com"), BulkEntry("no-tags@example.com", {1: "int key"})]
SEND = {
    "from_address": "Shop <news@shop.example>",
    "template": "flash-sale",
    "configuration_set": "marketing",
    "default_tags": {"kind": "marketing"},
    "default_data": {"sale": "½ price"},
}


def api_entry(e: BulkEntry) -> dict[str, Any]:
    """The BulkEmailEntry of the SES API reference, as plain dicts, for botocore to walk."""
    entry: dict[str, Any] = {
        "Destination": {"ToAddresses": [e.to]},
        "ReplacementEmailContent": {
            "ReplacementTemplate": {"ReplacementTemplateData": json.dumps(dict(e.replacement_data))}
        },
    }
    if e.headers:
        entry["ReplacementHeaders"] = [{"Name": k, "Value": v} for k, v in e.headers.items()]
    if e.tags:
        entry["ReplacementTags"] = [{"Name": k, "Value": v} for k, v in e.tags.items()]
    return entry


def captured_request(call: Any) -> tuple[bytes, dict[str, str]]:
    try:
        call()
    except SesCallFailed as failed:
        caught: BaseException | None = failed.__cause__
    except Captured as direct:
        caught = direct
    else:
        raise AssertionError("the request was not captured")
    assert isinstance(caught, Captured)
    return caught.body, caught.headers


def sent_body(client: Any, entries: list[BulkEntry] = ENTRIES) -> tuple[bytes, dict[str, str]]:
    """What SesSender.send_bulk puts on the wire through `client`."""
    sender = SesSender(client)
    client.meta.events.register("before-send.sesv2.SendBulkEmail", capture)
    return captured_request(lambda: sender.send_bulk(entries=entries, **SEND))


def botocore_body(entries: list[BulkEntry] = ENTRIES) -> tuple[bytes, dict[str, str]]:
    """What botocore itself writes for the same request (a client without flashsend's hooks,
    entries as the API's dicts, in send_bulk's key order)."""
    client = plain_client(settings())
    client.meta.events.register("before-send.sesv2.SendBulkEmail", capture)
    request = {
        "FromEmailAddress": SEND["from_address"],
        "DefaultContent": {
            "Template": {
                "TemplateName": SEND["template"],
                "TemplateData": json.dumps(SEND["default_data"]),
            }
        },
        "ConfigurationSetName": SEND["configuration_set"],
        "DefaultEmailTags": [{"Name": "kind", "Value": "marketing"}],
        "BulkEmailEntries": [api_entry(e) for e in entries],
    }
    return captured_request(lambda: client.send_bulk_email(**request))


def test_the_prebuilt_body_is_byte_for_byte_what_botocore_writes() -> None:
    client = make_client(settings())
    walked: list[int] = []  # entries left for botocore's walk (registered after our hook)
    SesSender(client)
    client.meta.events.register(
        "before-parameter-build.sesv2.SendBulkEmail",
        lambda params, **_: walked.append(len(params["BulkEmailEntries"])),
    )
    ours, our_headers = sent_body(client)
    assert walked == [0]
    theirs, their_headers = botocore_body()
    assert ours == theirs
    assert json.loads(ours)["BulkEmailEntries"][0]["Destination"] == {
        "ToAddresses": ["user0@example.com"]
    }
    assert our_headers["Content-Type"] == their_headers["Content-Type"]
    assert our_headers["Content-Length"] == their_headers["Content-Length"] == str(len(ours))


def test_one_entry_and_odd_template_data_are_written_as_json_would() -> None:
    for entries in ([BulkEntry("solo@example.com")], ENTRIES[48:], ENTRIES[:1]):
        assert sent_body(make_client(settings()), entries)[0] == botocore_body(entries)[0]


def test_a_second_sender_on_the_same_client_writes_the_same_body() -> None:
    client = make_client(settings())
    SesSender(client)
    first, _ = sent_body(client)
    assert first == botocore_body()[0]


def test_a_bad_header_fails_before_anything_is_sent() -> None:
    client = make_client(settings())
    with pytest.raises(TypeError):
        sent_body(client, [BulkEntry("a@example.com", headers={"X-Count": 3})])  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="at most 15"):
        sent_body(client, [BulkEntry("a@example.com", headers={f"X-{i}": "v" for i in range(16)})])


def test_the_body_is_put_back_only_for_the_call_that_built_it() -> None:
    client = make_client(settings())
    first, _ = sent_body(client)
    second, _ = sent_body(client)
    assert first == second


def test_send_bulk_email_serialises_as_an_identity_copy() -> None:
    """Why the prebuilt body is right: no member is renamed, sent in a header or the URL, or
    converted (blobs, timestamps, floats), except attachments' raw content (base64), which
    sinks.ses never sends and whose requests keep botocore's own serialiser. A model update
    that adds another such member fails here."""
    model = make_client(settings()).meta.service_model.operation_model("SendBulkEmail")
    odd: list[str] = []

    def walk(shape: Any, path: str) -> None:
        if shape.serialization.get("location") or shape.serialization.get("name"):
            odd.append(f"{path}: {shape.serialization}")
        if shape.type_name == "structure":
            for name, member in shape.members.items():
                walk(member, f"{path}.{name}")
        elif shape.type_name == "list":
            walk(shape.member, f"{path}[]")
        elif shape.type_name == "map":
            walk(shape.value, f"{path}{{}}")
        elif shape.type_name not in IDENTITY_LEAVES:
            odd.append(f"{path}: {shape.type_name}")

    walk(model.input_shape, "SendBulkEmail")
    assert odd == ["SendBulkEmail.DefaultContent.Template.Attachments[].RawContent: blob"]


def test_a_request_with_attachments_keeps_botocores_serialiser() -> None:
    client = make_client(settings())
    client.meta.events.register("before-send.sesv2.SendBulkEmail", capture)
    with pytest.raises(Captured) as caught:
        client.send_bulk_email(
            FromEmailAddress="news@shop.example",
            DefaultContent={
                "Template": {
                    "TemplateName": "t",
                    "TemplateData": "{}",
                    "Attachments": [{"FileName": "a.txt", "RawContent": b"hello"}],
                }
            },
            BulkEmailEntries=[{"Destination": {"ToAddresses": ["a@example.com"]}}],
        )
    assert b'"RawContent": "aGVsbG8="' in caught.value.body  # base64, as botocore writes it
