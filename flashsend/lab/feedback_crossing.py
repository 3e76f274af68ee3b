"""Which event made a campaign cross its pause threshold, and when it reached us.

The e2e asks how long the feedback loop takes from the event that crosses the threshold to
the campaign's pause. That event is found by replaying the campaign's SES events from
mail.events in the order they reached the webhook (`received_at`, the moment the stand-in's
POST arrived: its emission, on one machine) through the agent's own pure rules
(`ses_effect`, `pause_reason`): the first event after which `pause_reason` answers is the
crossing one. Its `occurred_at` is when the stand-in built it, so the difference between
the two is the stand-in's own queue (SNS's, in production).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from flashsend.lab.feedback_run import end_offsets
from flashsend.settings import Settings
from schemas import serde
from streams.feedback_ingest import SCHEMA_HEADER
from streams.rules.feedback_logic import Thresholds, Window, pause_reason, ses_effect


@dataclass(frozen=True)
class Crossing:
    event_id: str
    event_type: str
    received_at_ms: int  # at the webhook: the stand-in's POST arrived
    occurred_at_ms: int  # the event's own timestamp: when the stand-in built it
    window: Window  # the campaign's counters once this event is applied
    reason: str
    events_before: int  # the campaign's events that reached us before this one


def find_crossing(
    records: Iterable[Mapping[str, Any]], campaign_id: int, thresholds: Thresholds
) -> Crossing | None:
    """The first of `records` (decoded ses_event records, any order) after which the
    campaign's counters, applied in the order the records reached the webhook, pause it."""
    mine = {
        str(r["event_id"]): r for r in records if r.get("campaign_id") == campaign_id
    }  # a redelivered event counts once, as the agent's dedupe makes it
    ordered = sorted(mine.values(), key=lambda r: (int(r["received_at"]), str(r["event_id"])))
    counts = {"sent": 0, "delivered": 0, "bounced": 0, "complained": 0}
    for n, record in enumerate(ordered):
        counter = ses_effect(record).counter
        if counter in counts:
            counts[counter] += 1
        window = Window(**counts)
        reason = pause_reason(window, thresholds)
        if reason is not None:
            return Crossing(
                event_id=str(record["event_id"]),
                event_type=str(record["event_type"]),
                received_at_ms=int(record["received_at"]),
                occurred_at_ms=int(record["occurred_at"]),
                window=window,
                reason=reason,
                events_before=n,
            )
    return None


def read_ses_events(
    settings: Settings,
    topic: str,
    timeout_s: float = 120.0,
    *,
    start: Mapping[int, int] | None = None,
    every: int = 1,
) -> list[dict[str, Any]]:
    """The ses_event records on `topic` now (from `start`, default the beginning, to the
    current end), decoded; with `every` > 1 only those whose offset is a multiple of it (a
    uniform sample that decodes nothing else)."""
    ends = end_offsets(settings, topic)
    begin = dict(start or {})
    codec = serde.codec(settings, "ses_event")
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"crossing-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    out: list[dict[str, Any]] = []
    try:
        left = {p: end for p, end in ends.items() if end > begin.get(p, 0)}
        consumer.assign([TopicPartition(topic, p, begin.get(p, 0)) for p in left])
        deadline = time.monotonic() + timeout_s
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(left)} not read to their end")
            for msg in consumer.consume(1000, timeout=2.0):
                if msg.error() is not None:
                    continue
                p, offset = msg.partition(), msg.offset()
                if p in left and offset is not None and offset + 1 >= left[p]:
                    del left[p]
                if offset is None or offset % every:
                    continue
                schema = dict(msg.headers() or []).get(SCHEMA_HEADER)
                if schema == b"ses_event":
                    out.append(codec.decode(msg.value()))
    finally:
        consumer.close()
    return out
