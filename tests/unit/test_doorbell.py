"""The hand-written doorbell encoder must produce exactly fastavro's bytes, and doorbells of
contract v1 (one recipient) must still be read."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from schemas.doorbell import (
    DOORBELL_BLOCK,
    DoorbellWriter,
    doorbell_seqs,
    has_doorbell_shape,
    zigzag_varint,
)
from schemas.serde import SCHEMA_DIR, AvroCodec, registry_client

REGISTRY = "mock://doorbell-unit"


@pytest.fixture(scope="module")
def codec() -> AvroCodec:
    return AvroCodec(registry_client(REGISTRY), "campaign_recipient")


def _record(cid: int, at: int, members: list[tuple[int, int]]) -> dict[str, object]:
    (seq, uid), more = members[0], members[1:]
    return {
        "campaign_id": cid,
        "seq": seq,
        "user_id": uid,
        "produced_at_ms": at,
        "more_recipients": [{"seq": s, "user_id": u} for s, u in more],
    }


def test_the_current_contract_takes_the_fast_path(codec: AvroCodec) -> None:
    assert has_doorbell_shape(codec.schema)


@pytest.mark.parametrize("n", [0, 1, -1, 63, 64, -64, -65, 127, 128, 2**31 - 1, -(2**31), 2**62])
def test_zigzag_varint_matches_avro(codec: AvroCodec, n: int) -> None:
    # A long field alone: the record's body for campaign_id = n, everything else 0.
    body = codec.encode(_record(n, 0, [(0, 0)]))
    assert body[5:] == zigzag_varint(n) + b"\x00\x00\x00\x00"


def test_bytes_equal_fastavro_and_decode_back(codec: AvroCodec) -> None:
    rng = random.Random(7)
    for _ in range(2_000):
        cid = rng.choice([1, 12, 2**40, rng.randrange(2**62)])
        at = rng.choice([0, 1_796_000_000_000, rng.randrange(2**62)])
        size = rng.choice([1, 2, DOORBELL_BLOCK, rng.randrange(1, 70)])
        members = [
            (rng.choice([1, rng.randrange(2**31)]), rng.choice([0, rng.randrange(2**63)]))
            for _ in range(size)
        ]
        writer = DoorbellWriter(codec, cid, at)
        record = _record(cid, at, members)
        assert writer.encode(members) == codec.encode(record)
        decoded = codec.decode(writer.encode(members))
        assert decoded == record
        assert doorbell_seqs(decoded) == [s for s, _ in members]


def test_an_empty_block_is_refused(codec: AvroCodec) -> None:
    with pytest.raises(ValueError):
        DoorbellWriter(codec, 1, 0).encode([])


def test_a_v1_doorbell_still_decodes_as_one_recipient(codec: AvroCodec, tmp_path: Path) -> None:
    """Records written before contract v2 (left in the topic over an upgrade) ring for one."""
    (tmp_path / "campaign_recipient.v1.avsc").write_text(
        (SCHEMA_DIR / "campaign_recipient.v1.avsc").read_text()
    )
    v1 = AvroCodec(registry_client(REGISTRY), "campaign_recipient", tmp_path, auto_register=True)
    assert v1.schema_id != codec.schema_id
    old = v1.encode({"campaign_id": 7, "seq": 41, "user_id": 9001, "produced_at_ms": 5})
    decoded = codec.decode(old)
    assert decoded["more_recipients"] == []
    assert doorbell_seqs(decoded) == [41]


def test_a_changed_contract_is_not_taken_for_the_doorbell_shape(codec: AvroCodec) -> None:
    """A contract with another field list must go through fastavro, not the fast path."""
    fields = codec.schema["fields"]
    assert not has_doorbell_shape({"fields": fields[:4]})  # v1's shape
    assert not has_doorbell_shape({"fields": [fields[1], fields[0], *fields[2:]]})
    renamed_item = {
        **fields[4],
        "type": {
            **fields[4]["type"],
            "items": {"type": "record", "name": "X", "fields": [{"name": "seq", "type": "long"}]},
        },
    }
    assert not has_doorbell_shape({"fields": [*fields[:4], renamed_item]})
