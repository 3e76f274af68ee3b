"""The campaign doorbell's bytes, written without fastavro's per-record walk.

A campaign produces one `campaign_recipient` record per recipient (a million per campaign),
and fastavro's schemaless_writer was 40% of the producer's time (profiled with py-spy). The
record is four integers, so its Avro body is four zig-zag varints, two of which are the same
for the whole campaign. `DoorbellWriter` precomputes the constant prefix and suffix and writes
only `seq` and `user_id` per record. It is used only when the codec's schema has exactly the
expected fields, in order; `tests/unit/test_doorbell.py` checks the bytes against fastavro.
"""

from __future__ import annotations

from typing import Any

from schemas.serde import AvroCodec

# Doorbells per producer batch (librdkafka `batch.num.messages`). The broker hands a consumer
# whole batches, so this is also how many records of ONE partition a fetch can bring at once:
# with librdkafka's default (10,000) a worker's stream buffer filled with one partition's
# records while its other partitions' lanes sat idle (docs/design.md §11). Pairs with
# streams.app.DOORBELL_FETCH_BYTES and streams.sender.UNCLAIMED_PER_PARTITION.
DOORBELL_BATCH_RECORDS = 500

EXPECTED_FIELDS = (
    ("campaign_id", "long"),
    ("seq", "int"),
    ("user_id", "long"),
    ("produced_at_ms", "long"),
)


def zigzag_varint(n: int) -> bytes:
    """Avro's encoding of int and long: zig-zag, then 7 bits per byte, low bits first."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def has_doorbell_shape(schema: dict[str, Any]) -> bool:
    fields = tuple((f.get("name"), f.get("type")) for f in schema.get("fields", []))
    return fields == EXPECTED_FIELDS


class DoorbellWriter:
    """Encodes doorbells of one campaign produced at one instant."""

    def __init__(self, codec: AvroCodec, campaign_id: int, produced_at_ms: int) -> None:
        self._codec = codec
        self._campaign_id = campaign_id
        self._produced_at_ms = produced_at_ms
        self._fast = has_doorbell_shape(codec.schema)
        self._prefix = codec.header + zigzag_varint(campaign_id)
        self._suffix = zigzag_varint(produced_at_ms)

    def encode(self, seq: int, user_id: int) -> bytes:
        if self._fast:
            return self._prefix + zigzag_varint(seq) + zigzag_varint(user_id) + self._suffix
        return self._codec.encode(
            {
                "campaign_id": self._campaign_id,
                "seq": seq,
                "user_id": user_id,
                "produced_at_ms": self._produced_at_ms,
            }
        )
