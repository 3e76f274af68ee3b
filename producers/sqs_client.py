"""Amazon SQS for the events puller: a small asyncio client of the SQS JSON protocol.

Only what `flashsend events pull` calls on every batch: ReceiveMessage (long polling) and
DeleteMessageBatch, as SigV4-signed HTTP/1.1 POSTs on kept-alive connections, with the
credentials of the default boto3 chain (environment, profile, instance role, refreshed as
boto3 refreshes them) or the stack's local keys when the endpoint is a local server. Why not
boto3 (or aiohttp with botocore's signer) here: per request they cost more CPU than the rest
of the puller's work on the ten events it carries (figures in docs/decisions.md), and asyncio
long polls need no thread each. Everything else (queue set-up, the bench's fill) uses boto3
(`boto3_sqs`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.credentials import Credentials, ReadOnlyCredentials
from botocore.exceptions import BotoCoreError, ClientError

from flashsend.errors import FlashsendError, UsageError
from flashsend.settings import Settings

CONTENT_TYPE = "application/x-amz-json-1.0"
MAX_BATCH = 10  # SQS: at most 10 messages per receive and per batch call
MAX_WAIT_S = 20  # SQS: the longest long poll
MAX_ANSWER_BYTES = 4 * 1024 * 1024  # 10 messages of up to 256 KB each, with their attributes
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class SqsError(FlashsendError):
    """An SQS call failed (the puller retries every kind: throttling, 5xx, a lost connection,
    and a 4xx that an operator fixes, like a missing queue)."""

    def __init__(self, code: str, message: str, *, status: int = 0) -> None:
        self.code = code
        self.status = status
        super().__init__(f"SQS {code}: {message}"[:500])


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
    except (BotoCoreError, ClientError) as exc:
        raise UsageError(f"SQS at {sqs_endpoint(settings)} did not answer: {exc}") from exc


def sigv4_headers(
    *,
    host: str,
    path: str,
    body: bytes,
    target: str,
    region: str,
    credentials: ReadOnlyCredentials,
    amz_date: str,
    keys: dict[tuple[str, str, str], bytes] | None = None,
) -> dict[str, str]:
    """The headers of a SigV4-signed SQS JSON request (pure; `amz_date` as 20260101T120000Z).

    What botocore's SigV4Auth computes for the same request (a unit test compares the two),
    without its request objects: the signing key is derived once a day and kept in `keys`."""
    headers = {"Content-Type": CONTENT_TYPE, "Host": host, "X-Amz-Date": amz_date}
    headers["X-Amz-Target"] = target
    if credentials.token:
        headers["X-Amz-Security-Token"] = credentials.token
    lowered = sorted((k.lower(), " ".join(v.split())) for k, v in headers.items())
    signed = ";".join(k for k, _v in lowered)
    canonical = "\n".join(
        (
            "POST",
            path or "/",
            "",
            "".join(f"{k}:{v}\n" for k, v in lowered),
            signed,
            hashlib.sha256(body).hexdigest(),
        )
    )
    day = amz_date[:8]
    scope = f"{day}/{region}/sqs/aws4_request"
    to_sign = (
        f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n" + hashlib.sha256(canonical.encode()).hexdigest()
    )
    cache = keys if keys is not None else {}
    key = cache.get((credentials.secret_key, day, region))
    if key is None:
        key = f"AWS4{credentials.secret_key}".encode()
        for part in (day, region, "sqs", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        cache.clear()  # one key at a time: a new day or rotated credentials replace it
        cache[(credentials.secret_key, day, region)] = key
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    return headers


class _Connection:
    """One kept-alive HTTP/1.1 connection: a request, then its whole answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def exchange(self, head: bytes, body: bytes) -> tuple[int, bytes, bool]:
        """(status, body, whether the connection may be reused)."""
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise ConnectionError(f"not an HTTP answer: {status_line[:80]!r}")
        status = int(parts[1])
        length: int | None = None
        chunked = False
        keep = parts[0] == b"HTTP/1.1"
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                keep = value.strip().lower() != b"close"
        if chunked:
            data = bytearray()
            while size := int((await self.reader.readline()).split(b";")[0], 16):
                data += await self.reader.readexactly(size)
                await self.reader.readexactly(2)
            while (await self.reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return status, bytes(data), keep
        if length is None:
            return status, await self.reader.read(), False
        return status, await self.reader.readexactly(length), keep

    def close(self) -> None:
        self.writer.close()


class SqsClient:
    """ReceiveMessage and DeleteMessageBatch over a few kept-alive HTTP/1.1 connections.

    A small client of its own (SigV4 by `sigv4_headers`, HTTP over asyncio streams): per
    request it costs a fraction of aiohttp's and botocore's request objects, and the puller
    makes two requests per ten events."""

    def __init__(
        self,
        endpoint: str,
        region: str,
        credentials: Callable[[], ReadOnlyCredentials],
        *,
        connections: int = 16,
        timeout_s: float = 10.0,
    ) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"not an http(s) SQS endpoint: {endpoint!r}")
        self.tls = parts.scheme == "https"
        self.hostname = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        default = (self.tls and self.port == 443) or (not self.tls and self.port == 80)
        self.host = self.hostname if default else f"{self.hostname}:{self.port}"
        self.path = parts.path or "/"
        self.region = region
        self.credentials = credentials
        self.timeout_s = timeout_s
        self._slots = asyncio.Semaphore(connections)
        self._idle: list[_Connection] = []
        self._keys: dict[tuple[str, str, str], bytes] = {}

    @classmethod
    def for_settings(cls, settings: Settings, *, connections: int = 16) -> SqsClient:
        return cls(
            sqs_endpoint(settings),
            settings.ses_region,
            credentials_source(settings),
            connections=connections,
        )

    def _request(self, action: str, payload: dict[str, Any]) -> tuple[bytes, bytes]:
        body = _dumps(payload).encode()
        headers = sigv4_headers(
            host=self.host,
            path=self.path,
            body=body,
            target=f"AmazonSQS.{action}",
            region=self.region,
            credentials=self.credentials(),
            amz_date=time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()),
            keys=self._keys,
        )
        head = f"POST {self.path} HTTP/1.1\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers.items()
        )
        head += f"Content-Length: {len(body)}\r\n\r\n"
        return head.encode(), body

    async def _connect(self) -> _Connection:
        context = ssl.create_default_context() if self.tls else None
        reader, writer = await asyncio.open_connection(
            self.hostname, self.port, ssl=context, limit=MAX_ANSWER_BYTES
        )
        return _Connection(reader, writer)

    async def call(self, action: str, payload: dict[str, Any], *, timeout_s: float) -> Any:
        head, body = self._request(action, payload)
        async with self._slots:
            status, raw = await self._exchange(head, body, timeout_s)
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"message": raw[:200].decode(errors="replace")}
        if status != 200:
            code = str(data.get("__type", f"HTTP{status}")).rpartition("#")[2]
            message = str(data.get("message") or data.get("Message") or "")
            raise SqsError(code, message, status=status)
        return data

    async def _exchange(self, head: bytes, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        """On a kept-alive connection, or a new one; a kept-alive one the server closed
        meanwhile is replaced once (both calls are safe to repeat: a repeated receive only
        hides its messages until the visibility timeout, a repeated delete deletes nothing)."""
        for reused in (bool(self._idle), False):
            conn = self._idle.pop() if reused else None
            try:
                if conn is None:
                    conn = await asyncio.wait_for(self._connect(), self.timeout_s)
                status, raw, keep = await asyncio.wait_for(conn.exchange(head, body), timeout_s)
            except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
                if conn is not None:
                    conn.close()
                if reused and not isinstance(exc, TimeoutError):
                    continue
                raise SqsError(type(exc).__name__, str(exc) or "no answer") from exc
            except asyncio.CancelledError:
                if conn is not None:
                    conn.close()  # a request may be half-way: never reuse the connection
                raise
            if keep:
                self._idle.append(conn)
            else:
                conn.close()
            return status, raw
        raise AssertionError("unreachable")

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
        while self._idle:
            self._idle.pop().close()


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
