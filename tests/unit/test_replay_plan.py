"""Replay plan classification and refusals (pure)."""

from __future__ import annotations

from streams.rules.replay_plan import (
    PartitionPlan,
    blocking,
    clamp_target,
    classify_campaign,
    classify_mail,
    refusals,
    replay_range,
)

NOW = 1_700_000_000_000
DAY_MS = 86_400_000


def test_ranges_and_clamping() -> None:
    assert replay_range(100, 40) == (40, 100)  # rewind: 40..99 delivered again
    assert replay_range(40, 100) == (40, 100)  # skip: 40..99 never processed
    assert clamp_target(-5, 10, 50) == 10 and clamp_target(99, 10, 50) == 50


def test_campaign_records_pending_send_done_dedup_twice_rung_once() -> None:
    rows = {
        (1, 1): ("pending", "sending"),
        (1, 2): ("sent", "sending"),
        (2, 1): ("pending", "done"),
        (1, 3): ("skipped", "sending"),
    }
    counts, campaigns = classify_campaign([(1, 1), (1, 1), (1, 2), (2, 1), (1, 3), (9, 9)], rows)
    assert counts == {"send": 1, "dedup": 4, "dead": 1}
    assert campaigns == {1: "sending", 2: "done", 9: "missing"}


def test_mail_events_known_keys_and_repeats() -> None:
    events = [
        ("create", "e1", "k1"),
        ("create", "e2", "k2"),
        ("create", "e3", "k2"),
        ("create", "e4", "k4"),
        ("cancel", "e5", None),
        ("ignored", None, None),
    ]
    counts = classify_mail(events, known_event_ids={"e1"}, known_keys={"k4"})
    assert counts == {"dedup": 3, "send": 1, "cancel": 1, "ignored": 1}


def plan(partition: int, current: int, target: int, **kw: object) -> PartitionPlan:
    p = PartitionPlan(partition, current, target, 0, 1000)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def test_refusals() -> None:
    old = plan(0, 100, 10, target_timestamp_ms=NOW - 9 * DAY_MS)
    recent = plan(1, 100, 10, target_timestamp_ms=NOW - DAY_MS)
    found = refusals(
        kind="mail",
        live_members=2,
        partitions=[old, recent],
        campaigns={},
        now_ms=NOW,
        dedupe_retention_s=8 * 86400,
    )
    assert [r.code for r in found] == ["live_members", "too_old"]
    assert [r.code for r in blocking(found, i_understand=True)] == ["live_members"]
    skip = plan(0, 10, 100, counts={"send": 3})
    assert [
        r.code
        for r in refusals(
            kind="mail",
            live_members=0,
            partitions=[skip],
            campaigns={},
            now_ms=NOW,
            dedupe_retention_s=1,
        )
    ] == ["lost_mail"]
    done = refusals(
        kind="campaign",
        live_members=0,
        partitions=[plan(0, 50, 0)],
        campaigns={1: "sending", 2: "done"},
        now_ms=NOW,
        dedupe_retention_s=0,
    )
    assert [r.code for r in done] == ["finished_campaign"] and "[2]" in done[0].message
    assert blocking(done, i_understand=True) == []
    none = refusals(
        kind="campaign",
        live_members=0,
        partitions=[plan(0, 5, 5)],
        campaigns={},
        now_ms=NOW,
        dedupe_retention_s=0,
    )
    assert [r.code for r in none] == ["nothing_to_do"]
