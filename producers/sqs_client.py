"""Amazon SQS for the events puller: a small asyncio client of the SQS JSON protocol.

Only what `flashsend events pull` calls on every batch: ReceiveMessage (long polling) and
DeleteMessageBatch. Requests are signed with botocore's SigV4 signer and the credentials of the
default boto3 chain (environment, profile, instance role, refreshed as boto3 refreshes them),
or the stack's local keys when the endpoint is a local server. Why not boto3 here: its
serializer, hooks and response parser walk the service model on every call, which made boto3
the largest CPU cost per event of the puller (figures in docs/decisions.md), and asyncio long
polls need no thread each. Everything else (queue set-up, the bench's fill) uses boto3
(`boto3_sqs`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials, ReadOnlyCredentials

from flashsend.errors import FlashsendError, UsageError
from flashsend.settings import Settings

CONTENT_TYPE = "application/x-amz-json-1.0"
MAX_BATCH = 10  # SQS: at most 10 messages per receive and per batch call
MAX_WAIT_S = 20  # SQS: the longest long poll
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class SqsError(FlashsendError):
    """An SQS call failed; `retryable` says whether the same call may succeed later."""

    def __init__(self, code: str, message: str, *, status: int = 0) -> None:
        self.code = code
        self.status = status
        super().__init__(f"SQS {code}: {message}"[:500])

    @property
    def retryable(self) -> bool:
        return self.status == 0 or self.status >= 500 or "Throttl" in self.code


class SqsCredentialsMissing(UsageError):
    """No AWS credentials for real Amazon SQS."""


@dataclass(frozen=True, slots=True)
class SqsMessage:
    message_id: str
    receipt_handle: str
    body: str
    receive_count: int
    sent_at_ms: int | None


def sqs_endpoint(settings: Settings) -> str:
    return settings.sqs_endpoint_url or f"https://sqs.{settings.ses_region}.amazonaws.com"


def credentials_source(settings: Settings) -> Callable[[], ReadOnlyCredentials]:
    """The stack's local keys for a local endpoint, else the default boto3 chain."""
    if settings.sqs_endpoint_url:
        frozen = Credentials(
            settings.ses_access_key_id, settings.ses_secret_access_key.get_secret_value()
        ).get_frozen_credentials()
        return lambda: frozen
    chain = boto3.session.Session().get_credentials()
    if chain is None:
        raise SqsCredentialsMissing(
            "no AWS credentials for Amazon SQS: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            "AWS_PROFILE or run with an instance role (or FLASHSEND_SQS_ENDPOINT for a local "
            "server)"
        )
    frozen_now: Callable[[], ReadOnlyCredentials] = chain.get_frozen_credentials
    return frozen_now


def boto3_sqs(settings: Settings, *, endpoint: str | None = None, timeout: float = 10.0) -> Any:
    """A boto3 SQS client on the stack's endpoint (set-up, bench and tests)."""
    local = endpoint or settings.sqs_endpoint_url
    return boto3.session.Session().client(
        "sqs",
        endpoint_url=local,
        region_name=settings.ses_region,
        aws_access_key_id=settings.ses_access_key_id if local else None,
        aws_secret_access_key=settings.ses_secret_access_key.get_secret_value() if local else None,
        config=Config(
            connect_timeout=min(5.0, timeout),
            read_timeout=timeout,
            retries={"mode": "standard", "max_attempts": 3},
        ),
    )


def queue_url(settings: Settings, name: str | None = None) -> str:
    """The URL of a queue by name, as SQS answers GetQueueUrl."""
    client = boto3_sqs(settings)
    try:
        return str(client.get_queue_url(QueueName=name or settings.sqs_queue)["QueueUrl"])
    except client.exceptions.QueueDoesNotExist:
        raise UsageError(
            f"SQS queue {name or settings.sqs_queue!r} does not exist at "
            f"{sqs_endpoint(settings)}: create it with `flashsend aws apply --path sqs`"
        ) from None


class SqsClient:
    """ReceiveMessage and DeleteMessageBatch over one kept-alive aiohttp session."""

    def __init__(
        self,
        endpoint: str,
        region: str,
        credentials: Callable[[], ReadOnlyCredentials],
        *,
        connections: int = 16,
        timeout_s: float = 10.0,
    ) -> None:
        self.endpoint = endpoint.rstrip("/") + "/"
        self.region = region
        self.credentials = credentials
        self.connections = connections
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def for_settings(cls, settings: Settings, *, connections: int = 16) -> SqsClient:
        return cls(
            sqs_endpoint(settings),
            settings.ses_region,
            credentials_source(settings),
            connections=connections,
        )

    def _signed(self, action: str, payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        body = _dumps(payload).encode()
        request = AWSRequest(
            "POST",
            self.endpoint,
            data=body,
            headers={"Content-Type": CONTENT_TYPE, "X-Amz-Target": f"AmazonSQS.{action}"},
        )
        SigV4Auth(self.credentials(), "sqs", self.region).add_auth(request)
        return body, dict(request.headers.items())

    async def call(self, action: str, payload: dict[str, Any], *, timeout_s: float) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.connections, keepalive_timeout=30)
            )
        body, headers = self._signed(action, payload)
        try:
            async with self._session.post(
                self.endpoint,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                raw = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise SqsError(type(exc).__name__, str(exc) or "no answer") from exc
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"message": raw[:200].decode(errors="replace")}
        if status != 200:
            code = str(data.get("__type", f"HTTP{status}")).rpartition("#")[2]
            message = str(data.get("message") or data.get("Message") or "")
            raise SqsError(code, message, status=status)
        return data

    async def receive(
        self,
        queue_url: str,
        *,
        max_messages: int = MAX_BATCH,
        wait_s: int = MAX_WAIT_S,
        visibility_s: int | None = None,
    ) -> list[SqsMessage]:
        payload: dict[str, Any] = {
            "QueueUrl": queue_url,
            "MaxNumberOfMessages": max(1, min(MAX_BATCH, max_messages)),
            "WaitTimeSeconds": max(0, min(MAX_WAIT_S, wait_s)),
            "MessageSystemAttributeNames": ["ApproximateReceiveCount", "SentTimestamp"],
        }
        if visibility_s is not None:
            payload["VisibilityTimeout"] = visibility_s
        data = await self.call("ReceiveMessage", payload, timeout_s=wait_s + self.timeout_s)
        return [_message(m) for m in data.get("Messages") or ()]

    async def delete(self, queue_url: str, receipts: Sequence[str]) -> list[str]:
        """Delete up to 10 messages by receipt handle; return the handles SQS did not delete."""
        if not receipts:
            return []
        entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(receipts)]
        data = await self.call(
            "DeleteMessageBatch",
            {"QueueUrl": queue_url, "Entries": entries},
            timeout_s=self.timeout_s,
        )
        return [receipts[int(f["Id"])] for f in data.get("Failed") or ()]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _message(m: dict[str, Any]) -> SqsMessage:
    attributes = m.get("Attributes") or {}
    sent = attributes.get("SentTimestamp")
    return SqsMessage(
        message_id=str(m.get("MessageId", "")),
        receipt_handle=str(m.get("ReceiptHandle", "")),
        body=str(m.get("Body", "")),
        receive_count=int(attributes.get("ApproximateReceiveCount", 1)),
        sent_at_ms=int(sent) if isinstance(sent, str) and sent.isdigit() else None,
    )
