"""The pure parts of the offset fence (sinks/offsets.py): which records a batch applies, and
where a new owner starts when the log no longer matches the stored offset."""

from __future__ import annotations

from sinks.offsets import Fence, Start, start_offset


def test_records_below_the_stored_offset_are_skipped_one_by_one() -> None:
    fence = Fence(starts={0: 150, 1: 0}, epochs={0: 3, 1: 3}, stale={2: 1})
    items = {
        0: [(o, f"r{o}") for o in (131, 149, 150, 151, 200)],
        1: [(5, "a"), (6, "b")],
        2: [(7, "stale")],
    }
    kept, skipped = fence.keep(items)
    assert kept == {0: ["r150", "r151", "r200"], 1: ["a", "b"]}
    assert skipped == 2  # 131 and 149; the stale partition's record is neither kept nor skipped


def test_a_batch_wholly_below_the_stored_offset_applies_nothing() -> None:
    kept, skipped = Fence(starts={0: 150}, epochs={0: 1}, stale={}).keep({0: [(100, "x")]})
    assert (kept, skipped) == ({}, 1)


def test_the_stored_offset_is_kept_while_it_fits_the_log() -> None:
    assert start_offset(40, "id-a", "id-a", 0, 100) == Start(40, "id-a")
    assert start_offset(100, "id-a", "id-a", 0, 100) == Start(100, "id-a")  # all consumed
    # First take after the migration: the id is adopted, the offset kept.
    assert start_offset(40, None, "id-a", 0, 100) == Start(40, "id-a")
    # No id from the broker and no bounds: nothing to judge by.
    assert start_offset(40, "id-a", None, None, None) == Start(40, "id-a")


def test_a_recreated_topic_starts_at_its_log_start() -> None:
    # A new id, even when the new topic already holds more records than were consumed.
    start = start_offset(40, "id-a", "id-b", 0, 500)
    assert (start.next_offset, start.topic_id) == (0, "id-b")
    assert start.why is not None and "recreated" in start.why
    # Without ids: a stored offset past the log end.
    start = start_offset(1000, None, None, 0, 30)
    assert (start.next_offset, start.why is not None) == (0, True)
    assert start_offset(1000, "id-a", None, 5, 30).next_offset == 5


def test_a_log_that_lost_its_tail_restarts_at_its_end() -> None:
    """Same topic, stored offset past the end: every record still in the log was applied,
    and new records, written from the end on, must not be fenced off."""
    start = start_offset(1000, "id-a", "id-a", 0, 900)
    assert (start.next_offset, start.topic_id) == (900, "id-a")
    assert start.why is not None
