"""The audit log (``AuditLog``) on the runtime's ``audit`` table and the module's ``audit_chain``: one statement per
call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bettercompute.modules.audit import AuditFilter, AuditRow, ChainLink, Position
from bettercompute_store_pg._db import Database, utc
from bettercompute_store_pg._repository import PgRepository

__all__ = ["REPOSITORIES", "PgAuditLog"]

_ROW = (
    "a.id, a.at, a.action, a.actor, a.tenant, a.resource_type, a.resource_id, a.decision_id, a.outcome, a.details,"
    " a.txid"
)

_LIST = f"""
SELECT {_ROW}, l.seq AS chain_seq, l.hash FROM {{s}}.audit a LEFT JOIN {{s}}.audit_chain l ON l.audit_id = a.id
WHERE a.id > :after
  AND (CAST(:tenant AS text) IS NULL OR a.tenant = :tenant)
  AND (CAST(:actor AS text) IS NULL OR a.actor = :actor)
  AND (CAST(:action AS text) IS NULL OR a.action = :action)
  AND (CAST(:resource_type AS text) IS NULL OR a.resource_type = :resource_type)
  AND (CAST(:resource_id AS text) IS NULL OR a.resource_id = :resource_id)
  AND (CAST(:since AS timestamptz) IS NULL OR a.at >= :since)
  AND (CAST(:until AS timestamptz) IS NULL OR a.at < :until)
ORDER BY a.id LIMIT :limit
"""

_GET = f"""
SELECT {_ROW}, l.seq AS chain_seq, l.hash FROM {{s}}.audit a LEFT JOIN {{s}}.audit_chain l ON l.audit_id = a.id
WHERE a.id = :id
"""

_LINKED_UNTIL = "SELECT audit_txid, audit_id FROM {s}.audit_chain ORDER BY audit_txid DESC, audit_id DESC LIMIT 1"

# Past the last link, and below the oldest transaction still running (as this statement's snapshot sees it): every
# row that will ever stand before these has committed (or never will).
_LINKABLE = f"""
SELECT {_ROW} FROM {{s}}.audit a
WHERE (a.txid, a.id) > (:after_txid, :after_id)
  AND a.txid < CAST(CAST(pg_snapshot_xmin(pg_current_snapshot()) AS text) AS bigint)
ORDER BY a.txid, a.id LIMIT :limit
"""

_UNLINKED = "SELECT count(*) AS n FROM {s}.audit a WHERE (a.txid, a.id) > (:after_txid, :after_id)"

_HEADS = """
SELECT c.chain, h.seq, h.hash FROM unnest(CAST(:chains AS text[])) AS c (chain)
CROSS JOIN LATERAL (
    SELECT seq, hash FROM {s}.audit_chain l WHERE l.chain = c.chain ORDER BY seq DESC LIMIT 1
) AS h
"""

_LINK = """
INSERT INTO {s}.audit_chain (chain, seq, audit_id, hash, audit_txid)
SELECT * FROM unnest(CAST(:chains AS text[]), CAST(:seqs AS bigint[]), CAST(:ids AS bigint[]),
    CAST(:hashes AS bytea[]), CAST(:txids AS bigint[]))
"""

# One index probe per chain (a loose scan), however many links each has.
_CHAINS = """
WITH RECURSIVE c (chain) AS (
    (SELECT chain FROM {s}.audit_chain ORDER BY chain LIMIT 1)
    UNION ALL
    SELECT (SELECT l.chain FROM {s}.audit_chain l WHERE l.chain > c.chain ORDER BY l.chain LIMIT 1)
    FROM c WHERE c.chain IS NOT NULL
)
SELECT chain FROM c WHERE chain IS NOT NULL
"""

_WALK = f"""
SELECT l.chain, l.seq, l.audit_id, l.hash AS link_hash, l.audit_txid, {_ROW}
FROM {{s}}.audit_chain l LEFT JOIN {{s}}.audit a ON a.id = l.audit_id
WHERE l.chain = :chain AND l.seq > :after_seq
ORDER BY l.seq LIMIT :limit
"""


def _row(row: Any, *, linked: bool = True) -> AuditRow:
    return AuditRow(
        id=row.id,
        at=utc(row.at),
        action=row.action,
        actor=row.actor,
        tenant=row.tenant,
        resource_type=row.resource_type,
        resource_id=row.resource_id,
        decision_id=row.decision_id,
        outcome=row.outcome,
        details=dict(row.details),
        position=(row.txid, row.id),
        chain_seq=row.chain_seq if linked else None,
        hash=bytes(row.hash) if linked and row.hash is not None else None,
    )


def _after(position: Position | None) -> dict[str, int]:
    txid, audit_id = position if position is not None else (-1, 0)
    return {"after_txid": txid, "after_id": audit_id}


class PgAuditLog(PgRepository):
    """``AuditLog`` on the ``audit`` and ``audit_chain`` tables."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._list = db.sql(_LIST)
        self._get = db.sql(_GET)
        self._linked_until = db.sql(_LINKED_UNTIL)
        self._linkable = db.sql(_LINKABLE)
        self._unlinked = db.sql(_UNLINKED)
        self._heads = db.sql(_HEADS)
        self._link = db.sql(_LINK)
        self._chains = db.sql(_CHAINS)
        self._walk = db.sql(_WALK)

    async def rows(self, where: AuditFilter, *, after: int | None, limit: int) -> list[AuditRow]:
        params = {
            "after": after or 0,
            "tenant": where.tenant,
            "actor": where.actor,
            "action": where.action,
            "resource_type": where.resource_type,
            "resource_id": where.resource_id,
            "since": where.since,
            "until": where.until,
            "limit": limit,
        }
        return [_row(r) for r in await self._fetch(self._list, params)]

    async def get(self, audit_id: int) -> AuditRow | None:
        rows = await self._fetch(self._get, {"id": audit_id})
        return _row(rows[0]) if rows else None

    async def linked_until(self) -> Position | None:
        rows = await self._fetch(self._linked_until, {})
        return (rows[0].audit_txid, rows[0].audit_id) if rows else None

    async def linkable(self, *, after: Position | None, limit: int) -> list[AuditRow]:
        rows = await self._fetch(self._linkable, {**_after(after), "limit": limit})
        return [_row(r, linked=False) for r in rows]

    async def unlinked(self, *, after: Position | None) -> int:
        rows = await self._fetch(self._unlinked, _after(after))
        return int(rows[0].n)

    async def heads(self, chains: Sequence[str]) -> dict[str, tuple[int, bytes]]:
        rows = await self._fetch(self._heads, {"chains": list(chains)})
        return {r.chain: (r.seq, bytes(r.hash)) for r in rows}

    async def link(self, links: Sequence[ChainLink]) -> None:
        params = {
            "chains": [k.chain for k in links],
            "seqs": [k.seq for k in links],
            "ids": [k.audit_id for k in links],
            "hashes": [k.hash for k in links],
            "txids": [k.position[0] for k in links],
        }
        await self._fetch_in_transaction("link", self._link, params)

    async def chains(self) -> list[str]:
        return [r.chain for r in await self._fetch(self._chains, {})]

    async def walk(self, chain: str, *, after_seq: int, limit: int) -> list[ChainLink]:
        rows = await self._fetch(self._walk, {"chain": chain, "after_seq": after_seq, "limit": limit})
        return [
            ChainLink(
                chain=r.chain,
                seq=r.seq,
                audit_id=r.audit_id,
                hash=bytes(r.link_hash),
                position=(r.audit_txid, r.audit_id),
                row=None if r.id is None else _row(r, linked=False),
            )
            for r in rows
        ]


REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {"log": PgAuditLog}
"""The adapters of this module's repositories, by ``Repository.name``."""
