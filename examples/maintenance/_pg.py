"""The PostgreSQL adapter of ``Windows`` and the module's migrations (module name ``maintenance``).

The table lives in the control plane's schema beside the core's; the migrations are versioned under the module's
own name in ``schema_migrations``. ``PgWindows`` is a ``PgRepository``: the store makes it once (the key
``MAINTENANCE`` names this file) and ``tx.repository(MAINTENANCE)`` binds it to the caller's transaction, so a window,
its authorization projection and the call's audit row commit together.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from bettercompute.ports import Migration
from bettercompute_store_pg import Database, PgRepository
from examples.maintenance._port import WindowRecord

__all__ = ["MIGRATIONS", "REPOSITORIES", "PgWindows"]

MIGRATIONS = (
    Migration(
        version=1,
        name="maintenance windows",
        sql="""
CREATE TABLE {schema}.maintenance_windows (
    id         text PRIMARY KEY,
    tenant     text NOT NULL,
    pool_id    text NOT NULL REFERENCES {schema}.pools (id) ON DELETE CASCADE,
    starts_at  timestamptz NOT NULL,
    ends_at    timestamptz NOT NULL CHECK (ends_at > starts_at),
    reason     text NOT NULL
);
CREATE INDEX maintenance_windows_tenant_page ON {schema}.maintenance_windows (tenant, starts_at, id);
""",
    ),
)

_COLUMNS = "id, tenant, pool_id, starts_at, ends_at, reason"
_INSERT = f"INSERT INTO {{s}}.maintenance_windows ({_COLUMNS}) VALUES (:id, :tenant, :pool_id, :starts, :ends, :reason)"
_PAGE = f"""
SELECT {_COLUMNS} FROM {{s}}.maintenance_windows
WHERE tenant = :tenant AND (CAST(:after_at AS timestamptz) IS NULL OR (starts_at, id) > (:after_at, :after_id))
ORDER BY starts_at, id LIMIT :limit
"""


def _record(row: Any) -> WindowRecord:
    return WindowRecord(
        id=row.id,
        tenant=row.tenant,
        pool_id=row.pool_id,
        starts_at=row.starts_at.astimezone(dt.UTC),
        ends_at=row.ends_at.astimezone(dt.UTC),
        reason=row.reason,
    )


class PgWindows(PgRepository):
    """``Windows`` on the ``maintenance_windows`` table; one statement per call."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._insert = db.sql(_INSERT)
        self._page = db.sql(_PAGE)

    async def create(self, record: WindowRecord) -> None:
        """Add a window in the transaction this adapter is bound to."""
        params = {
            "id": record.id,
            "tenant": record.tenant,
            "pool_id": record.pool_id,
            "starts": record.starts_at,
            "ends": record.ends_at,
            "reason": record.reason,
        }
        await self._fetch_in_transaction("create", self._insert, params)

    async def for_tenant(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[WindowRecord]:
        """A page of the tenant's windows by (start, id)."""
        after_at, after_id = after if after is not None else (None, None)
        rows = await self._fetch(
            self._page, {"tenant": tenant, "after_at": after_at, "after_id": after_id, "limit": limit}
        )
        return [_record(r) for r in rows]


REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {"windows": PgWindows}
"""This module's adapters by ``Repository.name``, found by the PostgreSQL store through ``MAINTENANCE.adapters``."""
