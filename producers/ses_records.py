"""Parsed SES event records → Kafka records for mail.events, the same for every ingest path.

The webhook (SNS HTTPS) and the SQS puller both call `out_records`, so a consumer cannot tell
which path an event came by: key = the recipient, Avro value, the same three headers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from producers.event_publisher import OutRecord
from producers.ses_events import SCHEMA
from schemas.serde import AvroCodec

_SCHEMA_HEADER = SCHEMA.encode()


def out_records(records: Iterable[dict[str, Any]], codec: AvroCodec) -> list[OutRecord]:
    return [
        OutRecord(
            key=r["recipient"].encode(),
            value=codec.encode(r),
            headers=[
                ("flashsend.schema", _SCHEMA_HEADER),
                ("event_type", str(r["event_type"]).encode()),
                ("event_id", str(r["event_id"]).encode()),
            ],
        )
        for r in records
    ]
