"""The SendBulkEmail body flashsend writes itself (sinks.ses) is the one botocore would write."""

from __future__ import annotations

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


def sent_body(client: Any) -> tuple[bytes, dict[str, str]]:
    client.meta.events.register("before-send.sesv2.SendBulkEmail", capture)
    entries = [
        BulkEntry(
            to=f"user{i}@example.com",
            replacement_data={"first_name": 'Zoë "quoted" \\ <b>', "n": i, "vip": i % 2 == 0},
            headers={
                "List-Unsubscribe": f"<https://u.example/{i}>",
                "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
            },
            tags={"campaign": "42", "seq": str(i)},
        )
        for i in range(50)
    ]
    with pytest.raises(SesCallFailed) as caught:
        SesSender(client).send_bulk(
            from_address="Shop <news@shop.example>",
            template="flash-sale",
            entries=entries,
            configuration_set="marketing",
            default_tags={"kind": "marketing"},
            default_data={"sale": "½ price"},
        )
    captured = caught.value.__cause__
    assert isinstance(captured, Captured)
    return captured.body, captured.headers


def test_the_prebuilt_body_is_byte_for_byte_what_botocore_writes() -> None:
    s = settings()
    client = make_client(s)
    walked: list[int] = []  # entries left for botocore's walk (registered after our hook)
    client.meta.events.register(
        "before-parameter-build.sesv2.SendBulkEmail",
        lambda params, **_: walked.append(len(params["BulkEmailEntries"])),
    )
    ours, our_headers = sent_body(client)
    assert walked == [0]
    theirs, their_headers = sent_body(plain_client(s))
    assert ours == theirs
    assert b'"BulkEmailEntries": []' not in ours
    assert our_headers["Content-Type"] == their_headers["Content-Type"]
    assert our_headers["Content-Length"] == their_headers["Content-Length"] == str(len(ours))


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
