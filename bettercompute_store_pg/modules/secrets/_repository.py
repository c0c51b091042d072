"""Secrets of the ``secrets`` group (``SecretStore``) in ``secrets``: the value only as the KMS
sealed it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bettercompute.errors import ConflictError
from bettercompute.modules.secrets import SecretRecord, value_context
from bettercompute_store_pg._db import Database, utc
from bettercompute_store_pg._repository import PgRepository
from bettercompute_store_pg._sealed import sealed_column

__all__ = ["REPOSITORIES", "PgSecrets"]

_COLUMNS = "id, tenant, name, scope, description, sealed_value, created_at"

_CREATE = f"""
INSERT INTO {{s}}.secrets (id, tenant, name, scope, description, sealed_value)
VALUES (:id, :tenant, :name, :scope, :description, :sealed_value)
ON CONFLICT (tenant, name) DO NOTHING
RETURNING {_COLUMNS}
"""

_LIST = f"""
SELECT {_COLUMNS} FROM {{s}}.secrets
WHERE tenant = :tenant AND (CAST(:after AS text) IS NULL OR name > :after)
ORDER BY name LIMIT :limit
"""

_DELETE = f"DELETE FROM {{s}}.secrets WHERE tenant = :tenant AND name = :name RETURNING {_COLUMNS}"

_NAMED = f"""
SELECT {_COLUMNS} FROM {{s}}.secrets
WHERE name = :name AND scope = ANY(CAST(:scopes AS text[])) AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
ORDER BY tenant, id
"""


def _record(row: Any) -> SecretRecord:
    return SecretRecord(
        id=row.id,
        tenant=row.tenant,
        name=row.name,
        scope=row.scope,
        description=row.description,
        sealed_value=bytes(row.sealed_value),
        created_at=utc(row.created_at),
    )


class PgSecrets(PgRepository):
    """``SecretStore`` on the ``secrets`` table (the secrets module's migrations); one statement per call."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._create = db.sql(_CREATE)
        self._list = db.sql(_LIST)
        self._delete = db.sql(_DELETE)
        self._named = db.sql(_NAMED)

    async def create(self, record: SecretRecord) -> SecretRecord:
        """Add a secret in the caller's transaction; ``ConflictError`` if the tenant has one of that name."""
        params = {
            "id": record.id,
            "tenant": record.tenant,
            "name": record.name,
            "scope": record.scope,
            "description": record.description,
            "sealed_value": record.sealed_value,
        }
        rows = await self._fetch_in_transaction("create", self._create, params)
        if not rows:
            raise ConflictError("this tenant has a secret of this name", details={"name": record.name})
        return _record(rows[0])

    async def for_tenant(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[SecretRecord]:
        """The tenant's secrets by name, after the name in ``after``."""
        params = {"tenant": tenant, "after": after[0] if after is not None else None, "limit": limit}
        rows = await self._fetch(self._list, params)
        return [_record(row) for row in rows]

    async def delete(self, *, tenant: str, name: str) -> SecretRecord | None:
        """Delete a secret of ``tenant`` in the caller's transaction."""
        rows = await self._fetch_in_transaction("delete", self._delete, {"tenant": tenant, "name": name})
        return _record(rows[0]) if rows else None

    async def named(self, name: str, *, scopes: Sequence[str], tenant: str | None = None) -> list[SecretRecord]:
        """The secrets called ``name`` scoped to one of ``scopes``."""
        rows = await self._fetch(self._named, {"name": name, "scopes": list(scopes), "tenant": tenant})
        return [_record(row) for row in rows]


REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {
    "secrets": PgSecrets,
    "sealed_secrets": sealed_column(
        "secrets", "sealed_value", lambda r: value_context(r.tenant, r.name), fields=("tenant", "name")
    ),
}
"""The adapters of this module's repositories, by ``Repository.name``."""
