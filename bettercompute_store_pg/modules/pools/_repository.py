"""Pools (``Pools``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bettercompute.errors import ConflictError
from bettercompute.modules.pools import PoolRecord
from bettercompute_store_pg._db import Database, dumps, utc
from bettercompute_store_pg._repository import PgRepository

__all__ = ["POOL_COLUMNS", "REPOSITORIES", "PgPools", "pool_record"]

POOL_COLUMNS = "id, tenant, name, pool_class, acceptance_checks, labels, node_policy, created_at, updated_at"

_POOL_CREATE = f"""
INSERT INTO {{s}}.pools (id, tenant, name, pool_class, acceptance_checks, labels, node_policy)
VALUES (:id, :tenant, :name, :pool_class, CAST(:checks AS text[]), CAST(:labels AS jsonb), CAST(:policy AS jsonb))
ON CONFLICT (tenant, name) DO NOTHING
RETURNING {POOL_COLUMNS}
"""

# Keyset paging: ``(created_at, id)`` is unique and never changes (a name can), so a page boundary stays put.
_POOL_LIST = f"""
SELECT {POOL_COLUMNS} FROM {{s}}.pools
WHERE tenant = :tenant AND (CAST(:after_at AS timestamptz) IS NULL OR (created_at, id) > (:after_at, :after_id))
ORDER BY created_at, id LIMIT :limit
"""

_POOL_GET = f"SELECT {POOL_COLUMNS} FROM {{s}}.pools WHERE id = :id"

# ``taken``: another pool of the tenant has the new name (then nothing is updated).
_POOL_UPDATE = f"""
WITH p AS (SELECT id, tenant FROM {{s}}.pools WHERE id = :id FOR UPDATE),
taken AS (
    SELECT 1 FROM {{s}}.pools AS o, p
    WHERE CAST(:name AS text) IS NOT NULL AND o.tenant = p.tenant AND o.name = :name AND o.id <> p.id
),
u AS (
    UPDATE {{s}}.pools AS t SET
        name = coalesce(CAST(:name AS text), t.name),
        acceptance_checks = coalesce(CAST(:checks AS text[]), t.acceptance_checks),
        labels = coalesce(CAST(:labels AS jsonb), t.labels),
        node_policy = coalesce(CAST(:policy AS jsonb), t.node_policy),
        updated_at = now()
    FROM p WHERE t.id = p.id AND NOT EXISTS (SELECT 1 FROM taken)
    RETURNING t.{POOL_COLUMNS.replace(", ", ", t.")}
)
SELECT u.*, EXISTS (SELECT 1 FROM taken) AS taken, EXISTS (SELECT 1 FROM p) AS found
FROM (SELECT 1) AS one LEFT JOIN u ON true
"""


def pool_record(row: Any, prefix: str = "") -> PoolRecord:
    """A pool from ``row``'s columns, named ``<prefix><column>`` (``pool_`` where a token's row carries its pool)."""

    def column(name: str) -> Any:
        return getattr(row, prefix + name)

    return PoolRecord(
        id=column("id"),
        tenant=column("tenant"),
        name=column("name"),
        pool_class=column("pool_class"),
        acceptance_checks=tuple(column("acceptance_checks")),
        labels=dict(column("labels")),
        node_policy=dict(column("node_policy")),
        created_at=utc(column("created_at")),
        updated_at=utc(column("updated_at")),
    )


class PgPools(PgRepository):
    """``Pools`` on the ``pools`` table; one statement per call."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._create = db.sql(_POOL_CREATE)
        self._list = db.sql(_POOL_LIST)
        self._get = db.sql(_POOL_GET)
        self._update = db.sql(_POOL_UPDATE)

    async def create(
        self,
        *,
        id: str,
        tenant: str,
        name: str,
        pool_class: str,
        acceptance_checks: Sequence[str],
        labels: Mapping[str, str],
        node_policy: Mapping[str, Any] | None = None,
    ) -> PoolRecord:
        """Add a pool in the caller's transaction.

        Raises:
            ConflictError: the tenant has a pool of that name.
        """
        params = {
            "id": id,
            "tenant": tenant,
            "name": name,
            "pool_class": pool_class,
            "checks": list(acceptance_checks),
            "labels": dumps(dict(labels)),
            "policy": dumps(dict(node_policy or {})),
        }
        rows = await self._fetch_in_transaction("create", self._create, params)
        if not rows:
            raise ConflictError("the tenant has a pool of that name", details={"path": "name", "name": name})
        return pool_record(rows[0])

    async def for_tenant(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[PoolRecord]:
        """The tenant's pools in ``(created_at, id)`` order, after ``after``."""
        after_at, after_id = after if after is not None else (None, None)
        params = {"tenant": tenant, "after_at": after_at, "after_id": after_id, "limit": limit}
        rows = await self._fetch(self._list, params)
        return [pool_record(row) for row in rows]

    async def get(self, id: str) -> PoolRecord | None:
        """A pool by id."""
        rows = await self._fetch(self._get, {"id": id})
        return pool_record(rows[0]) if rows else None

    async def update(
        self,
        *,
        id: str,
        name: str | None = None,
        acceptance_checks: Sequence[str] | None = None,
        labels: Mapping[str, str] | None = None,
        node_policy: Mapping[str, Any] | None = None,
    ) -> PoolRecord | None:
        """Change the given fields of a pool; ``None`` when there is no such pool.

        Raises:
            ConflictError: another pool of the tenant has the new name.
        """
        params = {
            "id": id,
            "name": name,
            "checks": list(acceptance_checks) if acceptance_checks is not None else None,
            "labels": dumps(dict(labels)) if labels is not None else None,
            "policy": dumps(dict(node_policy)) if node_policy is not None else None,
        }
        row = (await self._fetch_in_transaction("update", self._update, params))[0]
        if not row.found:
            return None
        if row.taken:
            raise ConflictError("the tenant has a pool of that name", details={"path": "name", "name": name})
        return pool_record(row)


REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {"pools": PgPools}
"""The adapters of this module's repositories, by ``Repository.name``."""
