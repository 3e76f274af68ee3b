"""SMS adapter: the only module that talks to boto3's `pinpoint-sms-voice-v2` (AWS End User
Messaging SMS). botocore errors never leave it: they become `SmsCallFailed`.

It sits beside `sinks.ses.SesSender` and is built the same way: SDK retries OFF (no
idempotency key: a retried SendTextMessage after a read timeout could text someone twice),
parameter validation off (the caller validates: E.164 numbers, streams.rules.phones), one client per
worker sized to the calls in flight. One message per call: the API has no bulk operation.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from flashsend.errors import FlashsendError
from flashsend.settings import Settings
from sinks.aws_client import provider_client

MAX_CONTEXT_KEYS = 5  # the model's ContextMap bound


class SmsCallFailed(FlashsendError):
    """The SendTextMessage call did not return a MessageId."""

    def __init__(
        self,
        code: str | None,
        http_status: int | None,
        *,
        timed_out: bool,
        message: str = "",
        reason: str | None = None,
    ) -> None:
        super().__init__(f"SMS call failed: {code or 'no response'} ({http_status}) {message}")
        self.code = code
        self.http_status = http_status
        self.timed_out = timed_out
        self.message = message
        self.reason = reason  # the exception's `Reason` member (e.g. the opted-out number)


@dataclass(frozen=True, slots=True)
class TextMessage:
    destination: str  # E.164
    body: str
    origination_identity: str
    configuration_set: str | None
    context: Mapping[str, str]  # at most 5: comes back on every event of the message
    message_type: str = "PROMOTIONAL"


def make_sms_client(settings: Settings, *, pool: int | None = None) -> Any:
    return provider_client(
        settings,
        "pinpoint-sms-voice-v2",
        timeout_s=settings.sms_timeout_s,
        pool=pool or max(10, settings.sms_inflight_calls * 2),
    )


def _translate(exc: Exception) -> SmsCallFailed:
    if isinstance(exc, ClientError):
        response: Mapping[str, Any] = exc.response
        err = response.get("Error", {})
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        reason = response.get("Reason") or err.get("Reason")
        return SmsCallFailed(
            err.get("Code"),
            status,
            timed_out=False,
            message=err.get("Message", ""),
            reason=str(reason) if reason else None,
        )
    if isinstance(exc, ReadTimeoutError | ConnectionClosedError):
        # The request went out; the provider may have accepted it. Never resend.
        return SmsCallFailed("ReadTimeout", None, timed_out=True, message=str(exc))
    if isinstance(exc, EndpointConnectionError | ConnectTimeoutError):
        return SmsCallFailed("ConnectError", None, timed_out=False, message=str(exc))
    return SmsCallFailed(type(exc).__name__, None, timed_out=True, message=str(exc))


class SmsSender:
    """`send_text` and the opt-out list, blocking (run them in a thread pool)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def send_text(self, message: TextMessage) -> str:
        """SendTextMessage; returns the MessageId."""
        request: dict[str, Any] = {
            "DestinationPhoneNumber": message.destination,
            "OriginationIdentity": message.origination_identity,
            "MessageBody": message.body,
            "MessageType": message.message_type,
            "Context": dict(message.context),
        }
        if message.configuration_set:
            request["ConfigurationSetName"] = message.configuration_set
        try:
            response = self._client.send_text_message(**request)
        except Exception as exc:
            raise _translate(exc) from exc
        return str(response["MessageId"])

    def opted_out_numbers(self, opt_out_list: str) -> Iterator[str]:
        """Every number of the opt-out list (DescribeOptedOutNumbers, all pages)."""
        token: str | None = None
        while True:
            request: dict[str, Any] = {"OptOutListName": opt_out_list, "MaxResults": 100}
            if token:
                request["NextToken"] = token
            try:
                page = self._client.describe_opted_out_numbers(**request)
            except Exception as exc:
                raise _translate(exc) from exc
            for item in page.get("OptedOutNumbers", []):
                yield str(item["OptedOutNumber"])
            token = page.get("NextToken")
            if not token:
                return
