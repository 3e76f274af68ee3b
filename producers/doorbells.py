"""Producing campaign doorbells: recipients grouped per partition, DOORBELL_BLOCK to a record.

The topic is partitioned by user_id with Kafka's Java-compatible partitioner (murmur2 of the
key `str(user_id)`, librdkafka's `murmur2_random`), so a user's doorbells always land on one
partition and other user_id-keyed topics can be co-partitioned with it. A block's key is its
first recipient's user_id and every other recipient in it maps to the same partition, so the
record sits exactly where each of its recipients' own records would. `kafka_partition` is that
partitioner in Python; tests/integration/test_doorbell_partitions.py checks it against
librdkafka's choice for the same keys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from confluent_kafka import Producer

from flashsend.errors import FlashsendError
from schemas.doorbell import DOORBELL_BLOCK, DoorbellWriter, Member

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), as an unsigned int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    whole = length & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail:
        if tail == 3:
            h ^= data[whole + 2] << 16
        if tail >= 2:
            h ^= data[whole + 1] << 8
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def user_key(user_id: int) -> bytes:
    return str(user_id).encode()


def kafka_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default (Java) partitioner and librdkafka's murmur2_random give
    a non-empty key."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class PartitionBlocks:
    """Groups (seq, user_id) rows into per-partition blocks of up to `size` recipients."""

    def __init__(self, partitions: int, size: int = DOORBELL_BLOCK) -> None:
        if partitions < 1 or size < 1:
            raise ValueError("partitions and block size must be at least 1")
        self._partitions = partitions
        self._size = size
        self._open: dict[int, list[Member]] = {}

    def add(self, seq: int, user_id: int) -> tuple[int, list[Member]] | None:
        """Add a row; returns (partition, block) when that partition's block is full."""
        partition = kafka_partition(user_key(user_id), self._partitions)
        block = self._open.setdefault(partition, [])
        block.append((seq, user_id))
        if len(block) < self._size:
            return None
        del self._open[partition]
        return partition, block

    def rest(self) -> Iterator[tuple[int, list[Member]]]:
        """The blocks not yet full, emptied."""
        blocks, self._open = self._open, {}
        yield from sorted(blocks.items())


def topic_partitions(producer: Producer, topic: str, timeout: float = 10.0) -> int:
    """The topic's partition count as the broker has it (not as configured: a topic whose
    partitions were added since keys its users by the new count)."""
    metadata = producer.list_topics(topic, timeout=timeout).topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        raise FlashsendError(f"topic {topic} is not available: {getattr(metadata, 'error', '')}")
    return len(metadata.partitions)


class DoorbellProducer:
    """Produces a campaign's doorbells in blocks; `flush()` sends the partial blocks left."""

    def __init__(
        self,
        producer: Producer,
        topic: str,
        writer: DoorbellWriter,
        on_delivery: Callable[[Any, Any], None],
        size: int = DOORBELL_BLOCK,
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._encode = writer.encode
        self._on_delivery = on_delivery
        partitions = topic_partitions(producer, topic)
        self._blocks = PartitionBlocks(partitions, size)
        self.records = 0
        self.recipients = [0] * partitions  # per partition, produced so far

    def add(self, rows: Iterable[tuple[int, int]]) -> None:
        add = self._blocks.add
        for seq, user_id in rows:
            full = add(seq, user_id)
            if full is not None:
                self._produce(*full)
        self._producer.poll(0)

    def flush(self) -> None:
        for partition, block in self._blocks.rest():
            self._produce(partition, block)

    def _produce(self, partition: int, block: list[Member]) -> None:
        value = self._encode(block)
        key = user_key(block[0][1])
        self.recipients[partition] += len(block)
        while True:
            try:
                self._producer.produce(
                    self._topic, value, key, partition=partition, on_delivery=self._on_delivery
                )
                self.records += 1
                return
            except BufferError:
                self._producer.poll(0.1)
