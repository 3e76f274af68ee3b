"""Mobile push adapter: the only module that talks to boto3's `sns` client for platform
applications and endpoints. botocore errors never leave it: they become `PushCallFailed`.

Built as `sinks.sms.SmsSender` is: SDK retries OFF (SNS has no idempotency key for Publish:
a retried Publish after a read timeout could notify a device twice), parameter validation off
(the caller builds the message), one client per worker sized to the publishes in flight. One
notification per call: Publish to an endpoint ARN has no batch form.
"""

from __future__ import annotations

from collections.abc import Mapping
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

# SNS's platform names for the platforms our table knows.
SNS_PLATFORM = {"FCM": "GCM", "APNS": "APNS"}


class PushCallFailed(FlashsendError):
    """The SNS call did not succeed."""

    def __init__(
        self, code: str | None, http_status: int | None, *, timed_out: bool, message: str = ""
    ) -> None:
        super().__init__(f"push call failed: {code or 'no response'} ({http_status}) {message}")
        self.code = code
        self.http_status = http_status
        self.timed_out = timed_out
        self.message = message


@dataclass(frozen=True, slots=True)
class Notification:
    endpoint_arn: str
    message: str  # MessageStructure=json: {"default": …, "GCM": "…", "APNS": "…"}
    attributes: Mapping[str, str]  # MessageAttributes (String), e.g. AWS.SNS.MOBILE.APNS.TTL


def make_push_client(settings: Settings, *, pool: int | None = None) -> Any:
    return provider_client(
        settings,
        "sns",
        timeout_s=settings.push_timeout_s,
        pool=pool or max(10, settings.push_inflight_calls * 2),
    )


def _translate(exc: Exception) -> PushCallFailed:
    if isinstance(exc, ClientError):
        response: Mapping[str, Any] = exc.response
        err = response.get("Error", {})
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return PushCallFailed(
            err.get("Code"), status, timed_out=False, message=err.get("Message", "")
        )
    if isinstance(exc, ReadTimeoutError | ConnectionClosedError):
        # The request went out; SNS may have published it. Never resend.
        return PushCallFailed("ReadTimeout", None, timed_out=True, message=str(exc))
    if isinstance(exc, EndpointConnectionError | ConnectTimeoutError):
        return PushCallFailed("ConnectError", None, timed_out=False, message=str(exc))
    return PushCallFailed(type(exc).__name__, None, timed_out=True, message=str(exc))


class PushSender:
    """Publish and the endpoint operations, blocking (run them in a thread pool)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def publish(self, notification: Notification) -> str:
        """Publish to one platform endpoint; returns the MessageId."""
        request: dict[str, Any] = {
            "TargetArn": notification.endpoint_arn,
            "MessageStructure": "json",
            "Message": notification.message,
        }
        if notification.attributes:
            request["MessageAttributes"] = {
                k: {"DataType": "String", "StringValue": v}
                for k, v in notification.attributes.items()
            }
        try:
            response = self._client.publish(**request)
        except Exception as exc:
            raise _translate(exc) from exc
        return str(response["MessageId"])

    def _call(self, operation: str, **request: Any) -> Any:
        try:
            return getattr(self._client, operation)(**request)
        except Exception as exc:
            raise _translate(exc) from exc

    def create_application(self, name: str, platform: str, failure_topic: str | None) -> str:
        """CreatePlatformApplication (FCM or APNS); delivery failures go to `failure_topic`."""
        attributes = {"PlatformCredential": "standin"}
        if failure_topic:
            attributes["EventDeliveryFailure"] = failure_topic
        answer = self._call(
            "create_platform_application",
            Name=name,
            Platform=SNS_PLATFORM[platform],
            Attributes=attributes,
        )
        return str(answer["PlatformApplicationArn"])

    def create_endpoint(self, application_arn: str, token: str, user_data: str = "") -> str:
        answer = self._call(
            "create_platform_endpoint",
            PlatformApplicationArn=application_arn,
            Token=token,
            **({"CustomUserData": user_data} if user_data else {}),
        )
        return str(answer["EndpointArn"])

    def endpoint_attributes(self, endpoint_arn: str) -> dict[str, str]:
        answer = self._call("get_endpoint_attributes", EndpointArn=endpoint_arn)
        return {str(k): str(v) for k, v in answer.get("Attributes", {}).items()}

    def set_endpoint_attributes(self, endpoint_arn: str, attributes: Mapping[str, str]) -> None:
        self._call("set_endpoint_attributes", EndpointArn=endpoint_arn, Attributes=dict(attributes))

    def delete_endpoint(self, endpoint_arn: str) -> None:
        self._call("delete_endpoint", EndpointArn=endpoint_arn)
