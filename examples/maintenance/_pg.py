"""The PostgreSQL adapter of ``Windows`` and the module's migrations (module name ``maintenance``).

The table lives in the control plane's schema beside the core's; the migrations are versioned under the module's
own name in ``schema_migrations``. Writes run on the caller's transaction (``connection_of``), so a window, its
authorization projection and the call's audit row commit together.
"""

from __future__ import annotations

import datetime as dt
import weakref
from collections.abc import Sequence
from typing import Any

from bettercompute.errors import InvalidConfigError
from bettercompute.ports import Migration, Store, Transaction
from bettercompute_store_pg import PgStore, connection_of, fetch_in
from examples.maintenance._port import WindowRecord

__all__ = ["MIGRATIONS", "PgWindows"]

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


_MADE: weakref.WeakKeyDictionary[PgStore, PgWindows] = weakref.WeakKeyDictionary()


class PgWindows:
    """``Windows`` on the ``maintenance_windows`` table; one statement per call. One per store: ``of(store)``."""

    @classmethod
    def of(cls, store: Store) -> PgWindows:
        """The adapter for ``store``, made on first use.

        Raises:
            InvalidConfigError: ``store`` is not the PostgreSQL store.
        """
        if not isinstance(store, PgStore):
            raise InvalidConfigError(
                "the maintenance module needs the PostgreSQL store",
                details={"problems": [f"store is a {type(store).__name__}, not a PgStore"]},
            )
        made = _MADE.get(store)
        if made is None:
            made = _MADE[store] = cls(store)
        return made

    def __init__(self, store: PgStore) -> None:
        self._store = store
        self._insert = store.sql(_INSERT)
        self._page = store.sql(_PAGE)

    async def create(self, tx: Transaction, record: WindowRecord) -> None:
        """Add a window in the caller's transaction."""
        params = {
            "id": record.id,
            "tenant": record.tenant,
            "pool_id": record.pool_id,
            "starts": record.starts_at,
            "ends": record.ends_at,
            "reason": record.reason,
        }
        await fetch_in(connection_of(tx), self._insert, params)

    async def for_tenant(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[WindowRecord]:
        """A page of the tenant's windows by (start, id)."""
        after_at, after_id = after if after is not None else (None, None)
        rows = await self._store.fetch(
            self._page, {"tenant": tenant, "after_at": after_at, "after_id": after_id, "limit": limit}
        )
        return [_record(r) for r in rows]
