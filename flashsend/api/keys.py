"""API keys and roles, pure: the key's format, its hash, what each role may do, and the
per-key request budget (a token bucket that takes `now`).

A key is `fsk_<prefix>_<secret>`: the prefix (8 characters) is public, stored as is and
shown by `api-key list`; the secret carries 256 bits from `secrets`. Only the sha256 of the
whole key is stored: the key has the entropy a slow hash would add for a password.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string
import threading
from dataclasses import dataclass

ROLES = ("viewer", "operator", "admin")
# What a request needs: read (viewer), control a campaign (operator), everything (admin).
_RANK = {"viewer": 0, "operator": 1, "admin": 2}
_PREFIX_ALPHABET = string.ascii_lowercase + string.digits
PREFIX_LEN = 8
# Compared against when the prefix is unknown, so that answer costs what a wrong key costs.
_DUMMY_HASH = hashlib.sha256(b"fsk_unknown").digest()


def new_key() -> tuple[str, str]:
    """(key, prefix): the key is shown once; the prefix tells keys apart."""
    prefix = "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(PREFIX_LEN))
    return f"fsk_{prefix}_{secrets.token_urlsafe(32)}", prefix


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def bearer_key(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header, else None."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def key_prefix(key: str) -> str | None:
    """The public prefix of a well-formed key, else None."""
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != "fsk" or len(parts[1]) != PREFIX_LEN or not parts[2]:
        return None
    return parts[1]


def hash_matches(key: str, stored: bytes | None) -> bool:
    """Constant-time comparison; an unknown prefix (`stored` None) compares too, and fails."""
    ok = hmac.compare_digest(key_hash(key), stored if stored is not None else _DUMMY_HASH)
    return ok and stored is not None


def allows(role: str, needed: str) -> bool:
    return _RANK.get(role, -1) >= _RANK[needed]


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


@dataclass
class TokenBucket:
    """`per_minute` requests a minute, in bursts of up to `burst`; `take(now)` answers 0.0
    when a request may go, else the seconds until one may."""

    per_minute: float
    burst: float
    tokens: float = -1.0
    at: float = 0.0

    def take(self, now: float) -> float:
        rate = self.per_minute / 60.0
        if self.tokens < 0:
            self.tokens, self.at = self.burst, now
        self.tokens = min(self.burst, self.tokens + (now - self.at) * rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / rate if rate > 0 else float("inf")


class Budgets:
    """One token bucket per API key id (per process: each API process keeps its own)."""

    def __init__(self, per_minute: float, burst: float | None = None) -> None:
        self.per_minute = per_minute
        self.burst = burst if burst is not None else max(1.0, per_minute / 10.0)
        self._buckets: dict[int, TokenBucket] = {}
        self._lock = threading.Lock()  # requests run on a thread pool

    def take(self, key_id: int, now: float) -> float:
        if self.per_minute <= 0:
            return 0.0
        with self._lock:
            bucket = self._buckets.get(key_id)
            if bucket is None:
                bucket = self._buckets[key_id] = TokenBucket(self.per_minute, self.burst)
            return bucket.take(now)
