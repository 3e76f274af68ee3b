"""The campaign doorbell's bytes, written without fastavro's per-record walk.

A doorbell rings for a block of up to DOORBELL_BLOCK recipients of one campaign whose user_id
keys map to the same partition (contract `campaign_recipient` v2: the first recipient in the
top-level fields, the others in `more_recipients`). One record per recipient cost the workers
~30 % of their CPU in Faust's per-record path, and the broker and producer as much again per
record (py-spy, docs/decisions.md).

fastavro's schemaless_writer was 40% of the producer's time (profiled with py-spy), and the
record is integers only: its Avro body is zig-zag varints, two of which are the same for the
whole campaign. `DoorbellWriter` precomputes those and writes only the recipients. It is used
only when the codec's schema has exactly the expected fields, in order;
`tests/unit/test_doorbell.py` checks the bytes against fastavro.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from schemas.serde import AvroCodec

# Recipients per doorbell: a quarter of a lane (streams.sender.SenderConfig.lane_capacity),
# so the half lane a feeder claims at a time is two whole doorbells.
DOORBELL_BLOCK = 25
# Doorbells per producer batch (librdkafka `batch.num.messages`). The broker hands a consumer
# whole batches, so this bounds how many recipients of ONE partition a fetch can bring at
# once (here 500): with librdkafka's default (10,000 records) a worker's stream buffer filled
# with one partition's records while its other partitions' lanes sat idle
# (docs/decisions.md). Pairs with streams.app.DOORBELL_FETCH_BYTES and
# streams.sender.UNCLAIMED_PER_PARTITION.
DOORBELL_BATCH_RECORDS = 20

Member = tuple[int, int]  # (seq, user_id)

_MEMBER_FIELDS = (("seq", "int"), ("user_id", "long"))
EXPECTED_FIELDS: tuple[tuple[str, Any], ...] = (
    ("campaign_id", "long"),
    ("seq", "int"),
    ("user_id", "long"),
    ("produced_at_ms", "long"),
    ("more_recipients", ("array", _MEMBER_FIELDS)),
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


def _field_type(t: Any) -> Any:
    if isinstance(t, dict) and t.get("type") == "array" and isinstance(t.get("items"), dict):
        items = t["items"]
        return ("array", tuple((f.get("name"), f.get("type")) for f in items.get("fields", [])))
    return t


def has_doorbell_shape(schema: dict[str, Any]) -> bool:
    fields = tuple((f.get("name"), _field_type(f.get("type"))) for f in schema.get("fields", []))
    return fields == EXPECTED_FIELDS


def doorbell_seqs(doorbell: Mapping[str, Any]) -> list[int]:
    """The seqs a decoded doorbell rings for (a v1 doorbell decodes with no more_recipients)."""
    return [doorbell["seq"], *(m["seq"] for m in doorbell.get("more_recipients", ()))]


# The most recipients a consumer accepts in one doorbell: producers write DOORBELL_BLOCK; a
# block far larger is a producer bug, and would be claimed as one oversized chunk.
MAX_DOORBELL_RECIPIENTS = 40 * DOORBELL_BLOCK


def doorbell_problem(doorbell: Mapping[str, Any], seqs: Sequence[int]) -> str | None:
    """Why a decoded doorbell cannot name rows (campaign ids and seqs start at 1), or None."""
    if doorbell["campaign_id"] < 1:
        return f"campaign_id {doorbell['campaign_id']}"
    if len(seqs) > MAX_DOORBELL_RECIPIENTS:
        return f"{len(seqs)} recipients in one doorbell, at most {MAX_DOORBELL_RECIPIENTS}"
    if min(seqs) < 1:
        return f"seq {min(seqs)}"
    return None


class DoorbellWriter:
    """Encodes doorbells of one campaign produced at one instant."""

    def __init__(self, codec: AvroCodec, campaign_id: int, produced_at_ms: int) -> None:
        self._codec = codec
        self._campaign_id = campaign_id
        self._produced_at_ms = produced_at_ms
        self._fast = has_doorbell_shape(codec.schema)
        self._prefix = codec.header + zigzag_varint(campaign_id)
        self._stamp = zigzag_varint(produced_at_ms)

    def encode(self, members: Sequence[Member]) -> bytes:
        """One doorbell for `members` (at least one), all on the same partition."""
        if not members:
            raise ValueError("a doorbell rings for at least one recipient")
        (seq, user_id), more = members[0], members[1:]
        if not self._fast:
            return self._codec.encode(
                {
                    "campaign_id": self._campaign_id,
                    "seq": seq,
                    "user_id": user_id,
                    "produced_at_ms": self._produced_at_ms,
                    "more_recipients": [{"seq": s, "user_id": u} for s, u in more],
                }
            )
        parts = [self._prefix, zigzag_varint(seq), zigzag_varint(user_id), self._stamp]
        if more:  # an Avro array: one block of len(more) items, then the 0 that ends it
            parts.append(zigzag_varint(len(more)))
            for s, u in more:
                parts.append(zigzag_varint(s))
                parts.append(zigzag_varint(u))
        parts.append(b"\x00")
        return b"".join(parts)
