"""How far behind the feedback agent is, and the gate that holds campaign sends meanwhile.

Why: the complaint- and bounce-rate pauses are only as current as the events the agent has
applied. A campaign sending faster than the agent applies its events (two cores shared by
everything, an agent slowed by its database) is mailing blind: by the time a complaint spike
is applied, minutes of mail went out. So campaign lanes start no call while the agent is more
than `max_lag_s` behind, and go on once it is back within half of that: a gate that opened at
the lag it closed at would flap with every report.

The agent reports, per partition of mail.events it owns (`ProgressTracker`), since when its
oldest event not yet applied has waited (`waiting_since`; None: nothing waits). That is the
Kafka timestamp of the last event it applied while more are in the partition (the next one
arrived no sooner), but never before the first report that saw the partition behind (an
event arriving after a quiet hour has not waited an hour). The lag is then `now - the oldest
waiting_since` over the partitions: it keeps growing while the agent is stuck, and drops as
soon as it has caught up. Reports older than a few seconds are not trusted either way (an
agent that stopped reporting no longer tells whether it is behind).

Pure: time comes in as arguments (epoch seconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Reports older than this are not trusted (the agent reports twice a second).
REPORT_FRESH_S = 5.0
REPORT_EVERY_S = 0.5


@dataclass
class _Partition:
    next_offset: int  # the next offset to apply
    applied_ts: float | None  # Kafka timestamp of the last event applied
    behind_since: float | None = None  # first report that saw events waiting


@dataclass
class ProgressTracker:
    """The agent's side: what it applied per partition, turned into reports."""

    _parts: dict[int, _Partition] = field(default_factory=dict)

    def applied(self, partition: int, last_offset: int, timestamp: float | None) -> None:
        """A batch up to `last_offset` of `partition` is committed; `timestamp` is its last
        record's Kafka timestamp (None when the record had none)."""
        part = self._parts.get(partition)
        if part is None:
            self._parts[partition] = _Partition(last_offset + 1, timestamp)
            return
        part.next_offset = max(part.next_offset, last_offset + 1)
        if timestamp is not None:
            part.applied_ts = max(part.applied_ts or timestamp, timestamp)

    def assigned(self, starts: Mapping[int, int]) -> None:
        """A new assignment: where the agent resumes each of its partitions (`starts`). A
        partition that starts elsewhere than where this tracker left it (new here, or applied
        by another worker meanwhile) starts afresh; the others are another worker's now."""
        for partition in [p for p in self._parts if p not in starts]:
            del self._parts[partition]
        for partition, start in starts.items():
            part = self._parts.get(partition)
            if part is None or part.next_offset != start:
                self._parts[partition] = _Partition(start, None)

    def partitions(self) -> list[int]:
        return sorted(self._parts)

    def forget(self, partition: int) -> None:
        """The partition went to another worker: its reports are that worker's now."""
        self._parts.pop(partition, None)

    def report(self, highwater: Mapping[int, int | None], now: float) -> dict[int, float | None]:
        """`waiting_since` per partition whose end offset (`highwater`) is known."""
        out: dict[int, float | None] = {}
        for partition, part in self._parts.items():
            end = highwater.get(partition)
            if end is None:
                continue
            if end <= part.next_offset:
                part.behind_since = None
                out[partition] = None
                continue
            if part.behind_since is None:
                part.behind_since = now
            applied = part.applied_ts if part.applied_ts is not None else part.behind_since
            out[partition] = max(applied, part.behind_since)
        return out


@dataclass
class FeedbackGate:
    """The sender's side: closed while the agent's lag is over `max_lag_s`, open again once
    it is back within half of it. `max_lag_s <= 0` never closes."""

    max_lag_s: float
    closed: bool = False

    def update(self, lag_s: float | None) -> bool:
        """The lag read from the agent's reports (0: none behind; None: no fresh report);
        returns whether the gate is closed."""
        if self.max_lag_s <= 0 or lag_s is None:
            self.closed = False
        elif self.closed:
            self.closed = lag_s > self.max_lag_s / 2
        else:
            self.closed = lag_s > self.max_lag_s
        return self.closed
