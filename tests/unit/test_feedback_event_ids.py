"""Event ids as the feedback statement receives them: one canonical spelling per UUID, so two
spellings of one event are one event (the batch is deduplicated by that spelling)."""

from __future__ import annotations

import uuid

from sinks.feedback_store import uuid_key


def test_every_spelling_of_one_uuid_has_one_key() -> None:
    u = uuid.UUID("0f1e2d3c-4b5a-5968-8776-a5b4c3d2e1f0")
    canonical = str(u)
    hexed = u.hex
    spellings = [
        canonical,
        canonical.upper(),
        hexed,
        "{" + canonical + "}",
        "urn:uuid:" + canonical,
        "-".join([hexed[:4], hexed[4:8], hexed[8:12], hexed[12:16], hexed[16:]]),  # 36 chars
    ]
    assert {uuid_key(s) for s in spellings} == {canonical}
