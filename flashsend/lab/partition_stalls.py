"""Did a partition stall? The longest time any Kafka partition of a campaign went without a
send between its first and its last (pure), and the query that feeds it.

A campaign's rate can look fine on average while one worker's partitions sit idle: in a 1M
bench, five of a worker's six partitions sent nothing for 24 s while the sixth kept the
worker busy (docs/decisions.md). The overall rate only showed a step down; per partition the
silence is plain.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import psycopg

from producers.doorbells import kafka_partition, user_key


@dataclass(frozen=True)
class Stall:
    seconds: float  # the longest silence of any partition between two of its sends
    partition: int | None  # which partition (None: no partition had two sends)
    ends_spread_s: float  # last partition to finish minus first partition to finish

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "max_s": round(self.seconds, 2),
            "partition": self.partition,
            "ends_spread_s": round(self.ends_spread_s, 2),
        }


def longest_silence(sends: Iterable[tuple[int, float]]) -> Stall:
    """`sends` are (partition, time of a send) in any order."""
    by_partition: dict[int, list[float]] = {}
    for partition, at in sends:
        by_partition.setdefault(partition, []).append(at)
    worst, which = 0.0, None
    ends = []
    for partition, times in sorted(by_partition.items()):
        times.sort()
        ends.append(times[-1])
        for before, after in itertools.pairwise(times):
            if after - before > worst:
                worst, which = after - before, partition
    spread = max(ends) - min(ends) if ends else 0.0
    return Stall(worst, which, spread)


# The campaign's rows, through the parent: a retired campaign simply has none.
SENDS = """
SELECT user_id, extract(epoch FROM sent_at)::float8
  FROM campaign_recipients
 WHERE campaign_id = %(campaign_id)s AND status = 'sent'
"""


def campaign_stall(dsn: str, campaign_id: int, partitions: int) -> Stall:
    """The campaign's longest per-partition silence, partitions as the producer picks them."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(SENDS, {"campaign_id": campaign_id}).fetchall()
    return longest_silence(
        (kafka_partition(user_key(int(user_id)), partitions), float(at)) for user_id, at in rows
    )
