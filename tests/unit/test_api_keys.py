"""API keys, roles, the request budget and the error shape: the pure parts."""

from __future__ import annotations

from flashsend.api.keys import (
    Budgets,
    TokenBucket,
    allows,
    bearer_key,
    hash_matches,
    key_hash,
    key_prefix,
    new_key,
)
from flashsend.api.problems import from_exception
from flashsend.errors import Conflict, NotFound, UsageError


def test_a_new_key_carries_its_prefix_and_only_its_hash_matches() -> None:
    key, prefix = new_key()
    other, _ = new_key()
    assert key_prefix(key) == prefix and len(key) > 50
    assert hash_matches(key, key_hash(key))
    assert not hash_matches(other, key_hash(key))
    assert not hash_matches(key, None)  # an unknown prefix never matches


def test_malformed_keys_and_headers_are_refused() -> None:
    assert key_prefix("fsk_short_x") is None
    assert key_prefix("nope") is None
    assert key_prefix("fsk_abcdefgh_") is None
    assert bearer_key("Bearer  k ") == "k"
    assert bearer_key("Basic abc") is None and bearer_key(None) is None


def test_roles_are_ordered() -> None:
    assert allows("admin", "operator") and allows("operator", "operator")
    assert not allows("viewer", "operator") and not allows("operator", "admin")
    assert not allows("nobody", "viewer")


def test_a_bucket_refuses_past_its_burst_and_refills_with_time() -> None:
    bucket = TokenBucket(per_minute=60, burst=2)
    assert bucket.take(0.0) == 0.0 and bucket.take(0.0) == 0.0
    wait = bucket.take(0.0)
    assert 0.99 <= wait <= 1.0
    assert bucket.take(1.0) == 0.0


def test_budgets_are_per_key_and_zero_means_none() -> None:
    budgets = Budgets(per_minute=60, burst=1)
    assert budgets.take(1, 0.0) == 0.0 and budgets.take(1, 0.0) > 0
    assert budgets.take(2, 0.0) == 0.0
    unlimited = Budgets(per_minute=0)
    assert all(unlimited.take(1, 0.0) == 0.0 for _ in range(100))


def test_errors_map_to_statuses_and_a_500_tells_nothing() -> None:
    assert from_exception(Conflict("x", state="paused"), None).body["state"] == "paused"
    assert from_exception(Conflict("x"), None).status == 409
    assert from_exception(NotFound("x"), None).status == 404
    assert from_exception(UsageError("bad"), None).status == 422
    crash = from_exception(RuntimeError("password=hunter2 at line 3"), None)
    assert crash.status == 500 and "hunter2" not in str(crash.body)
    assert crash.body["type"] == "about:blank" and crash.body["title"] == "Internal Server Error"
