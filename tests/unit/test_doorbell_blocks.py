"""Grouping recipients into per-partition doorbell blocks (producers/doorbells.py). That the
partitioner agrees with librdkafka's is checked against a real broker in
tests/integration/test_doorbell_partitions.py."""

from __future__ import annotations

import random

import pytest

from producers.doorbells import PartitionBlocks, kafka_partition, murmur2, user_key


def test_murmur2_known_values() -> None:
    # Values of org.apache.kafka.common.utils.Utils.murmur2 (Kafka's UtilsTest), as unsigned.
    assert murmur2(b"21") == -973932308 & 0xFFFFFFFF
    assert murmur2(b"foobar") == -790332482 & 0xFFFFFFFF
    assert murmur2(b"a-little-bit-long-string") == -985981536 & 0xFFFFFFFF
    assert murmur2(b"a-little-bit-longer-string") == -1486304829 & 0xFFFFFFFF
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971 & 0xFFFFFFFF
    assert murmur2(bytes([ord("a"), ord("b"), ord("c")])) == 479470107


@pytest.mark.parametrize("size", [1, 3, 25])
def test_blocks_hold_every_row_once_on_its_own_partition(size: int) -> None:
    rng = random.Random(size)
    rows = [(seq, rng.randrange(1, 10**9)) for seq in range(1, 2_001)]
    blocks = PartitionBlocks(12, size)
    out = [full for seq, uid in rows if (full := blocks.add(seq, uid)) is not None]
    assert all(len(block) == size for _, block in out)  # only full blocks come out of add()
    rest = list(blocks.rest())
    assert all(0 < len(block) < size for _, block in rest) and len({p for p, _ in rest}) == len(
        rest
    )
    assert list(blocks.rest()) == []  # rest() empties
    seen = [member for _, block in out + rest for member in block]
    assert sorted(seen) == rows
    for partition, block in out + rest:
        assert {kafka_partition(user_key(uid), 12) for _, uid in block} == {partition}
        assert [s for s, _ in block] == sorted(s for s, _ in block)  # seq order kept


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        PartitionBlocks(0)
    with pytest.raises(ValueError):
        PartitionBlocks(12, 0)
