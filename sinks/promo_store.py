"""PromoStore: a campaign's promo code pool for the command line and the lab (synchronous
psycopg), one method per named statement of sinks/sql/promo.sql.

Adding codes is one transaction that holds the campaign row: either every code of the file
(or every generated code) is in the pool and the campaign is marked as having one, or nothing
changed. The workers bind codes in their claim transaction (sinks/recipient_store.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from flashsend.errors import NotFound, UsageError
from sinks.audit_store import Actor, record
from sinks.pg_arrays import text_array
from sinks.queries import query
from streams.rules.promo_codes import Pattern, draw_codes, pool_refusal

_LISTED = 5  # codes already in the pool named in an import's error
_DRAWS = 20  # rounds of drawing again for codes the pool already held


@dataclass(frozen=True)
class PromoCounts:
    issued: int  # codes bound to a recipient
    left: int  # free codes

    def as_dict(self) -> dict[str, int]:
        return {"promo_codes_issued": self.issued, "promo_codes_left": self.left}


class PromoStore:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def import_codes(
        self, campaign_id: int, codes: Sequence[str], actor: Actor | None = None
    ) -> int:
        """Add `codes` (distinct) to the pool; UsageError, and nothing added, when the pool
        already holds one of them or the campaign cannot take codes."""
        with self.conn.transaction():
            self._lock(campaign_id)
            added = self._add(campaign_id, codes)
            if added != len(codes):
                present = [
                    str(r[0])
                    for r in self.conn.execute(
                        query("promo_codes_present"),
                        {"campaign_id": campaign_id, "codes": text_array(codes), "limit": _LISTED},
                    )
                ]
                raise UsageError(
                    f"{len(codes) - added:,} code(s) of the file are already in campaign "
                    f"{campaign_id}'s pool (e.g. {', '.join(present)}); nothing imported"
                )
            record(self.conn, actor, "promo import", campaign_id, detail={"added": added})
        return added

    def generate(
        self, campaign_id: int, pattern: Pattern, count: int, actor: Actor | None = None
    ) -> list[str]:
        """Draw `count` new codes into the pool (drawing again for any the pool held)."""
        made: list[str] = []
        with self.conn.transaction():
            self._lock(campaign_id)
            for _ in range(_DRAWS):
                wanted = count - len(made)
                codes = draw_codes(pattern, wanted, taken=made)
                if self._add(campaign_id, codes) == wanted:
                    record(self.conn, actor, "promo generate", campaign_id, detail={"added": count})
                    return made + codes
                # Some were in the pool: keep those that went in (ON CONFLICT left the rest).
                present = {
                    str(r[0])
                    for r in self.conn.execute(
                        query("promo_codes_present"),
                        {"campaign_id": campaign_id, "codes": text_array(codes), "limit": wanted},
                    )
                }
                made += [c for c in codes if c not in present]
            raise UsageError(f"could not draw {count:,} new codes: the pool is too dense")
        return made

    def counts(self, campaign_id: int) -> PromoCounts | None:
        """Codes issued and left, or None when the campaign has no pool."""
        row = self.conn.execute(query("promo_counts"), {"campaign_id": campaign_id}).fetchone()
        if row is None:
            raise NotFound(f"campaign {campaign_id} does not exist")
        if row[0] is None:
            return None
        return PromoCounts(int(row[0]), int(row[1]))

    def check(self, campaign_id: int) -> dict[str, int]:
        """The pool's invariants read from the rows (promo_bindings_check)."""
        cur = self.conn.execute(query("promo_bindings_check"), {"campaign_id": campaign_id})
        row = cur.fetchone()
        assert row is not None and cur.description is not None
        return {col.name: int(value) for col, value in zip(cur.description, row, strict=True)}

    def _lock(self, campaign_id: int) -> None:
        row = self.conn.execute(
            query("lock_promo_campaign"), {"campaign_id": campaign_id}
        ).fetchone()
        if row is None:
            raise NotFound(f"campaign {campaign_id} does not exist")
        refusal = pool_refusal(campaign_id, str(row[0]), bool(row[1]))
        if refusal is not None:
            raise UsageError(refusal)

    def _add(self, campaign_id: int, codes: Sequence[str]) -> int:
        row = self.conn.execute(
            query("add_promo_codes"), {"campaign_id": campaign_id, "codes": text_array(codes)}
        ).fetchone()
        return int(row[0]) if row else 0
