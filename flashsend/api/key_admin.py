"""Creating an API key: a new random key, its hash stored with its prefix and role, its
audit row in the same transaction. The key itself is returned once and kept nowhere."""

from __future__ import annotations

from datetime import datetime

import psycopg

from flashsend.api.keys import check_role, key_hash, new_key
from flashsend.settings import Settings
from sinks.api_key_store import ApiKeyStore
from sinks.audit_store import Actor


def create_key(
    settings: Settings, name: str, role: str, expires_at: datetime | None, actor: Actor
) -> tuple[str, str]:
    """(key, prefix)."""
    check_role(role)
    key, prefix = new_key()
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        ApiKeyStore(conn).create(
            name=name,
            prefix=prefix,
            key_hash=key_hash(key),
            role=role,
            expires_at=expires_at,
            actor=actor,
        )
    return key, prefix
