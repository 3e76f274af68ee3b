"""The webhook's Amazon Data Firehose endpoint: batches of SES events in, Avro on mail.events.

Why a second HTTP path beside SNS: SNS delivers one event per signed POST, and verifying and
answering each costs the webhook ~120 µs of CPU here. A configuration set's Firehose event
destination delivers hundreds of events per POST, authenticated once per request by the
stream's access key, so what is left per event is decoding and producing it.

Protocol (Firehose HTTP endpoint delivery, version 1.0): a POST whose JSON body is
`{"requestId", "timestamp", "records": [{"data": <base64>}, …]}`, gzip-compressed when the
stream says so, with the configured key in `X-Amz-Firehose-Access-Key`. Each record's data is
one SES event JSON (SES adds a newline). Firehose reads only a 200 whose JSON body echoes the
`requestId` as delivered; any other answer, or none within 3 minutes, and it retries the whole
request (same `requestId`) for the stream's retry duration, up to 2 hours, then writes the
records to its S3 backup. So an outage on our side loses nothing.

Answers:
- 401: no access key, or not one of ours (or none configured). Nothing is produced.
- 400: not a Firehose request (not JSON, no records list, undecodable gzip). Nothing is
  produced; Firehose retries and then backs the request up to S3, where it can be read.
- 413: the body, or its gzip-decompressed form, is larger than this endpoint takes.
- 503: the broker did not acknowledge every record in time: Firehose retries the request.
- 200: every record was acknowledged on mail.events or, when unreadable (bad base64, not an SES
  event), on the dead-letter topic with its reason; a retry of a request already acknowledged
  is answered 200 at once.
"""

from __future__ import annotations

import binascii
import hmac
import json
import logging
import time
import zlib
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from producers.dlq import DeadLetter, DeadLetterFailed, DeadLetterProducer
from producers.event_messages import parse_event_message
from producers.event_publisher import EventPublisher, PublishFailed
from producers.ses_events import SesEventInvalid
from producers.ses_records import out_records
from schemas.serde import AvroCodec

log = logging.getLogger("flashsend.webhook.firehose")

# What a stream buffering 4 MiB sends once base64 and JSON add their third, with room.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_RECORDS = 100_000
SEEN_REQUEST_IDS = 10_000  # requests acknowledged recently (Firehose retries reuse the id)
FIREHOSE_ID_PREFIX = "firehose:"  # the records' sns_message_id on this path
_JSON = "application/json"


class FirehoseRefused(Exception):
    """The request is refused as a whole; `status` is the HTTP answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class FirehoseRequest:
    request_id: str
    data: list[str | None]  # each record's decoded data; None when its base64 is not valid


def check_access_key(given: str, keys: Sequence[str]) -> None:
    """FirehoseRefused(401) unless `given` is one of `keys` (several: a rotation in progress).
    Compared in constant time: the key is the endpoint's only credential."""
    if not keys:
        raise FirehoseRefused(
            401, "no Firehose access key configured: set FLASHSEND_FIREHOSE_ACCESS_KEYS"
        )
    if not given:
        raise FirehoseRefused(401, "missing X-Amz-Firehose-Access-Key")
    supplied = given.encode()
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(supplied, key.encode())
    if not matched:
        raise FirehoseRefused(401, "access key not accepted")


def parse_request(body: bytes, content_encoding: str = "") -> FirehoseRequest:
    """A Firehose delivery request's id and records (pure); FirehoseRefused when the body is
    not one. A record whose base64 does not decode to UTF-8 text is kept as None: one bad
    record is dead-lettered, not a reason to refuse its whole batch."""
    if content_encoding.strip().lower() == "gzip":
        body = _gunzip(body)
    elif content_encoding.strip():
        raise FirehoseRefused(400, f"content-encoding {content_encoding!r} not supported")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise FirehoseRefused(400, "body is not JSON") from None
    if not isinstance(doc, dict):
        raise FirehoseRefused(400, "body is not a JSON object")
    request_id = doc.get("requestId")
    records = doc.get("records")
    if not isinstance(request_id, str) or not request_id or len(request_id) > 256:
        raise FirehoseRefused(400, "no requestId")
    if not isinstance(records, list):
        raise FirehoseRefused(400, "no records list")
    if len(records) > MAX_RECORDS:
        raise FirehoseRefused(413, f"more than {MAX_RECORDS} records")
    return FirehoseRequest(request_id, [_record_data(r) for r in records])


def _record_data(record: Any) -> str | None:
    data = record.get("data") if isinstance(record, dict) else None
    if not isinstance(data, str):
        return None
    try:
        return binascii.a2b_base64(data, strict_mode=True).decode()
    except (binascii.Error, ValueError):
        return None


def _gunzip(body: bytes) -> bytes:
    inflater = zlib.decompressobj(wbits=31)  # gzip header and trailer
    try:
        out = inflater.decompress(body, MAX_BODY_BYTES * 4)
    except zlib.error:
        raise FirehoseRefused(400, "body is not valid gzip") from None
    if inflater.unconsumed_tail:
        raise FirehoseRefused(413, f"decompressed body larger than {MAX_BODY_BYTES * 4} bytes")
    return out


def request_body(request_id: str, datas: Sequence[bytes], timestamp_ms: int | None = None) -> bytes:
    """A delivery request's body as Firehose builds it (the other side of `parse_request`:
    the stand-in and the benchmarks send these)."""
    stamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    records = [{"data": binascii.b2a_base64(d, newline=False).decode()} for d in datas]
    return json.dumps({"requestId": request_id, "timestamp": stamp, "records": records}).encode()


def request_headers(
    request_id: str, access_key: str, *, gzip: bool = False
) -> list[tuple[str, str]]:
    """The headers Firehose sends with a delivery request."""
    headers = [
        ("X-Amz-Firehose-Protocol-Version", "1.0"),
        ("X-Amz-Firehose-Request-Id", request_id),
        ("X-Amz-Firehose-Access-Key", access_key),
        ("Content-Type", _JSON),
    ]
    if gzip:
        headers.append(("Content-Encoding", "gzip"))
    return headers


def answer(request_id: str, error: str | None = None) -> bytes:
    """The response body Firehose reads: the request's id, a timestamp, and an error's text."""
    doc: dict[str, Any] = {"requestId": request_id, "timestamp": int(time.time() * 1000)}
    if error is not None:
        doc["errorMessage"] = error
    return json.dumps(doc).encode()


class FirehoseEndpoint:
    def __init__(
        self,
        *,
        access_keys: Sequence[str],
        publisher: EventPublisher,
        codec: AvroCodec,
        dlq: DeadLetterProducer,
        source: str = "firehose",
    ) -> None:
        self.access_keys = tuple(k for k in access_keys if k)
        self.publisher = publisher
        self.codec = codec
        self.dlq = dlq
        self.source = source  # the dead letters' topic field: where the records came from
        self.stats: Counter[str] = Counter()
        self._acked: OrderedDict[str, None] = OrderedDict()

    async def handle(self, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """(HTTP status, JSON body) for one delivery request; `headers` lowercased."""
        self.stats["requests"] += 1
        header_id = headers.get("x-amz-firehose-request-id", "")
        try:
            check_access_key(headers.get("x-amz-firehose-access-key", ""), self.access_keys)
            request = parse_request(body, headers.get("content-encoding", ""))
        except FirehoseRefused as exc:
            self.stats[f"refused:{exc.status}"] += 1
            log.warning("firehose request %s refused (%d): %s", header_id, exc.status, exc.message)
            return exc.status, answer(header_id, exc.message)
        if request.request_id in self._acked:
            self.stats["duplicates"] += 1
            return 200, answer(request.request_id)
        try:
            await self._publish(request)
        except (PublishFailed, DeadLetterFailed) as exc:
            self.stats["publish_failed"] += 1
            log.warning(
                "firehose request %s not acknowledged, Firehose retries: %s",
                request.request_id,
                exc,
            )
            return 503, answer(request.request_id, "not acknowledged by the broker")
        self._acked[request.request_id] = None
        while len(self._acked) > SEEN_REQUEST_IDS:
            self._acked.popitem(last=False)
        self.stats["delivered"] += 1
        return 200, answer(request.request_id)

    async def _publish(self, request: FirehoseRequest) -> None:
        received_ms = int(time.time() * 1000)
        prefix = f"{FIREHOSE_ID_PREFIX}{request.request_id}:"
        records: list[dict[str, Any]] = []
        letters: list[DeadLetter] = []
        for index, data in enumerate(request.data):
            message_id = f"{prefix}{index}"
            try:
                if data is None:
                    raise SesEventInvalid("bad_base64", "record data is not base64 UTF-8 text")
                records.extend(
                    parse_event_message(data, sns_message_id=message_id, received_at_ms=received_ms)
                )
            except SesEventInvalid as exc:
                raw = (data or "").encode()
                letters.append(
                    DeadLetter(self.source, 0, 0, message_id.encode(), raw, exc.reason, str(exc))
                )
        if letters:
            await self.dlq.publish(letters)
            for letter in letters:
                self.stats[f"dead:{letter.reason}"] += 1
            log.warning(
                "firehose request %s: %d unreadable record(s) dead-lettered",
                request.request_id,
                len(letters),
            )
        await self.publisher.publish(out_records(records, self.codec))
        self.stats["records"] += len(records)
