"""The hand-written doorbell encoder must produce exactly fastavro's bytes."""

from __future__ import annotations

import random

import pytest

from schemas.doorbell import DoorbellWriter, has_doorbell_shape, zigzag_varint
from schemas.serde import AvroCodec, registry_client


@pytest.fixture(scope="module")
def codec() -> AvroCodec:
    return AvroCodec(registry_client("mock://doorbell-unit"), "campaign_recipient")


def test_the_current_contract_takes_the_fast_path(codec: AvroCodec) -> None:
    assert has_doorbell_shape(codec.schema)


@pytest.mark.parametrize("n", [0, 1, -1, 63, 64, -64, -65, 127, 128, 2**31 - 1, -(2**31), 2**62])
def test_zigzag_varint_matches_avro(codec: AvroCodec, n: int) -> None:
    # A long field alone: the record's body for campaign_id = n, everything else 0.
    body = codec.encode({"campaign_id": n, "seq": 0, "user_id": 0, "produced_at_ms": 0})
    assert body[5:] == zigzag_varint(n) + b"\x00\x00\x00"


def test_bytes_equal_fastavro_and_decode_back(codec: AvroCodec) -> None:
    rng = random.Random(7)
    for _ in range(2_000):
        cid = rng.choice([1, 12, 2**40, rng.randrange(2**62)])
        at = rng.choice([0, 1_796_000_000_000, rng.randrange(2**62)])
        seq = rng.choice([1, rng.randrange(2**31)])
        uid = rng.choice([0, rng.randrange(2**63)])
        writer = DoorbellWriter(codec, cid, at)
        record = {"campaign_id": cid, "seq": seq, "user_id": uid, "produced_at_ms": at}
        assert writer.encode(seq, uid) == codec.encode(record)
        assert codec.decode(writer.encode(seq, uid)) == record


def test_a_changed_contract_is_not_taken_for_the_doorbell_shape() -> None:
    """A v2 contract with another field list must go through fastavro, not the fast path."""
    fields = [{"name": "campaign_id", "type": "long"}, {"name": "seq", "type": "int"}]
    assert not has_doorbell_shape({"fields": fields})
    reordered = [
        {"name": n, "type": t}
        for n, t in (("seq", "int"), ("campaign_id", "long"), ("user_id", "long"),
                     ("produced_at_ms", "long"))
    ]
    assert not has_doorbell_shape({"fields": reordered})
