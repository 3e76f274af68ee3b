"""The webhook's SNS endpoint: verify, confirm subscriptions, publish SES events to Kafka.

Answers (SNS retries only 5xx and network errors):
- 403: anything that fails parsing or verification (wrong topic, certificate URL not on an SNS
  host or not https, bad signature, unknown type…). Nothing is produced.
- 503: the certificate could not be fetched, or the broker did not acknowledge in time: SNS
  retries, and the message is not lost.
- 200: a confirmed subscription; a notification whose records the broker acknowledged; a
  duplicate MessageId already acknowledged; an authentic notification that is not a readable
  SES event (dead-lettered: a retry would not make it readable).

Certificates: `SnsVerifier` checks the URL policy before asking its source, and the source used
here never blocks the event loop: on a miss it raises, the URL (already checked) is fetched in a
thread, and verification runs again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.error
import urllib.request
from collections import Counter, OrderedDict
from datetime import UTC, datetime
from typing import Any

from producers.dlq import DeadLetter, DeadLetterFailed, DeadLetterProducer
from producers.event_messages import parse_event_message
from producers.event_publisher import EventPublisher, PublishFailed
from producers.ses_events import SesEventInvalid
from producers.ses_records import out_records
from producers.sns_verify import (
    CertificateSource,
    CertificateUnavailable,
    SnsMessage,
    SnsRejected,
    SnsVerifier,
    VerifierPolicy,
    parse_sns_body,
)
from schemas.serde import AvroCodec

log = logging.getLogger("flashsend.webhook.sns")

SEEN_MESSAGE_IDS = 100_000  # recently acknowledged SNS MessageIds (SNS reuses them on retries)
CONFIRM_TIMEOUT_S = 10.0


class _NotCached(Exception):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url


class _CachedCertificates:
    """Certificates already fetched; a miss raises _NotCached instead of blocking."""

    def __init__(self, source: CertificateSource, max_entries: int = 32) -> None:
        self.source = source
        self.max_entries = max_entries
        self._pems: OrderedDict[str, bytes] = OrderedDict()

    def get(self, url: str) -> bytes:
        pem = self._pems.get(url)
        if pem is None:
            raise _NotCached(url)
        return pem

    async def fetch(self, url: str) -> None:
        pem = await asyncio.to_thread(self.source.get, url)
        self._pems[url] = pem
        while len(self._pems) > self.max_entries:
            self._pems.popitem(last=False)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect would leave the host the URL check approved


def confirm_subscription(url: str, timeout: float = CONFIRM_TIMEOUT_S) -> None:
    """GET the (already validated) SubscribeURL; raise OSError unless SNS answered 200."""
    opener = urllib.request.build_opener(_NoRedirect)
    with opener.open(url, timeout=timeout) as response:
        if response.status != 200:
            raise OSError(f"SubscribeURL answered {response.status}")
        response.read(64 * 1024)


class SnsEndpoint:
    def __init__(
        self,
        *,
        policy: VerifierPolicy,
        certificates: CertificateSource,
        publisher: EventPublisher,
        codec: AvroCodec,
        dlq: DeadLetterProducer,
    ) -> None:
        self._certs = _CachedCertificates(certificates)
        self.verifier = SnsVerifier(policy, self._certs)
        self.publisher = publisher
        self.codec = codec
        self.dlq = dlq
        self.stats: Counter[str] = Counter()
        self._acked: OrderedDict[str, None] = OrderedDict()

    async def handle(self, body: bytes, header_type: str | None) -> tuple[int, str]:
        """(HTTP status, short text) for one SNS POST."""
        self.stats["received"] += 1
        try:
            msg = parse_sns_body(body, header_type)
            await self._verify(msg)
        except SnsRejected as exc:
            self.stats[f"rejected:{exc.reason}"] += 1
            log.warning("sns message rejected: %s", exc)
            return 403, exc.reason
        except CertificateUnavailable as exc:
            self.stats["certificate_unavailable"] += 1
            log.warning("sns certificate unavailable: %s", exc)
            return 503, "certificate unavailable"
        if msg.type == "SubscriptionConfirmation":
            return await self._confirm(msg)
        if msg.type == "UnsubscribeConfirmation":
            # Never re-subscribe by ourselves: someone removed the subscription on purpose.
            self.stats["unsubscribe_confirmations"] += 1
            log.warning("ALERT SNS subscription removed: topic=%s", msg.topic_arn)
            return 200, "noted"
        return await self._notification(msg)

    async def _verify(self, msg: SnsMessage) -> None:
        now = datetime.now(UTC)
        try:
            self.verifier.verify(msg, now=now)
        except _NotCached as miss:
            await self._certs.fetch(miss.url)  # URL already checked by verify()
            self.verifier.verify(msg, now=now)

    async def _confirm(self, msg: SnsMessage) -> tuple[int, str]:
        assert msg.subscribe_url is not None  # verify() refuses a confirmation without one
        try:
            await asyncio.to_thread(confirm_subscription, msg.subscribe_url)
        except (OSError, urllib.error.URLError) as exc:
            self.stats["confirm_failed"] += 1
            log.warning("subscription confirmation failed for %s: %s", msg.topic_arn, exc)
            return 502, "confirmation failed"
        self.stats["confirmed"] += 1
        log.info("SNS subscription confirmed: topic=%s", msg.topic_arn)
        return 200, "confirmed"

    async def _notification(self, msg: SnsMessage) -> tuple[int, str]:
        if msg.message_id in self._acked:
            self.stats["duplicates"] += 1
            return 200, "duplicate"
        received_ms = int(time.time() * 1000)
        try:
            records = parse_event_message(
                msg.message, sns_message_id=msg.message_id, received_at_ms=received_ms
            )
        except SesEventInvalid as exc:
            return await self._dead_letter(msg, exc)
        out = out_records(records, self.codec)
        try:
            await self.publisher.publish(out)
        except PublishFailed as exc:
            self.stats["publish_failed"] += 1
            log.warning("not acknowledged, SNS will retry %s: %s", msg.message_id, exc)
            return 503, "not published"
        self._remember(msg.message_id)
        self.stats["notifications"] += 1
        self.stats["records"] += len(out)
        return 200, "ok"

    async def _dead_letter(self, msg: SnsMessage, exc: SesEventInvalid) -> tuple[int, str]:
        letter = DeadLetter(
            msg.topic_arn, 0, 0, msg.message_id.encode(), msg.message.encode(), exc.reason, str(exc)
        )
        try:
            await self.dlq.publish([letter])
        except DeadLetterFailed:
            return 503, "dead letter not published"
        self._remember(msg.message_id)
        self.stats[f"dead:{exc.reason}"] += 1
        log.warning("unreadable SES notification dead-lettered: %s", exc)
        return 200, "dead-lettered"

    def _remember(self, message_id: str) -> None:
        self._acked[message_id] = None
        while len(self._acked) > SEEN_MESSAGE_IDS:
            self._acked.popitem(last=False)
