"""Tunnels (``Tunnels``): every change is one statement guarded by the state it leaves, so a ticket is spent once
and a tunnel closed once, whichever gateway or retry comes first."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from bettercompute.modules.nodes import TunnelRecord
from bettercompute_store_pg._db import Database, dumps, utc
from bettercompute_store_pg._repository import PgRepository

__all__ = ["PgTunnels"]

_COLUMNS = (
    "id, tenant, principal_id, credential_id, identity, node_id, host, port, resource_type, resource_id, action, "
    "created_at, expires_at, used_at, closed_at, close_reason, bytes_up, bytes_down"
)

_CREATE = """
INSERT INTO {s}.tunnels (id, secret_hash, tenant, principal_id, credential_id, identity, node_id, host, port,
    resource_type, resource_id, action, created_at, expires_at)
VALUES (:id, :secret_hash, :tenant, :principal_id, :credential_id, CAST(:identity AS jsonb), :node_id, :host, :port,
    :resource_type, :resource_id, :action, :created_at, :expires_at)
"""

_SPEND = f"""
UPDATE {{s}}.tunnels SET used_at = :now
WHERE id = :id AND secret_hash = :secret_hash AND used_at IS NULL AND closed_at IS NULL AND expires_at > :now
RETURNING {_COLUMNS}
"""

_GET = f"SELECT {_COLUMNS} FROM {{s}}.tunnels WHERE id = :id"
_CHECK = f"""
UPDATE {{s}}.tunnels SET checked_at = :now WHERE id = ANY(CAST(:ids AS text[]))
RETURNING {_COLUMNS}
"""

_SWEEP = f"""
WITH due AS (
    SELECT id, CASE WHEN used_at IS NULL THEN 'ticket_expired' ELSE 'gateway_lost' END AS reason
    FROM {{s}}.tunnels
    WHERE closed_at IS NULL AND coalesce(checked_at, used_at, expires_at) < :now
        AND (used_at IS NULL OR coalesce(checked_at, used_at) < :stale_before)
    ORDER BY coalesce(checked_at, used_at, expires_at)
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE {{s}}.tunnels AS t SET closed_at = :now, close_reason = due.reason
FROM due WHERE t.id = due.id
RETURNING {", ".join(f"t.{c.strip()}" for c in _COLUMNS.split(","))}
"""

_CLOSE = f"""
UPDATE {{s}}.tunnels SET closed_at = :now, close_reason = :reason, bytes_up = :bytes_up, bytes_down = :bytes_down
WHERE id = :id AND closed_at IS NULL
RETURNING {_COLUMNS}
"""


def _record(row: Any) -> TunnelRecord:
    return TunnelRecord(
        id=row.id,
        tenant=row.tenant,
        principal_id=row.principal_id,
        credential_id=row.credential_id,
        identity=dict(row.identity or {}),
        node_id=row.node_id,
        host=row.host,
        port=row.port,
        resource_type=row.resource_type,
        resource_id=row.resource_id,
        action=row.action,
        created_at=utc(row.created_at),
        expires_at=utc(row.expires_at),
        used_at=utc(row.used_at) if row.used_at is not None else None,
        closed_at=utc(row.closed_at) if row.closed_at is not None else None,
        close_reason=row.close_reason,
        bytes_up=row.bytes_up,
        bytes_down=row.bytes_down,
    )


class PgTunnels(PgRepository):
    """``Tunnels`` on the ``tunnels`` table (the identity module's migrations)."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._create = db.sql(_CREATE)
        self._spend = db.sql(_SPEND)
        self._get = db.sql(_GET)
        self._check = db.sql(_CHECK)
        self._sweep = db.sql(_SWEEP)
        self._close = db.sql(_CLOSE)

    async def create(self, record: TunnelRecord, *, secret_hash: bytes) -> None:
        """Insert a new tunnel (in a transaction)."""
        self._transaction("create")
        await self._rowcount(
            self._create,
            {
                "id": record.id,
                "secret_hash": secret_hash,
                "tenant": record.tenant,
                "principal_id": record.principal_id,
                "credential_id": record.credential_id,
                "identity": dumps(dict(record.identity)),
                "node_id": record.node_id,
                "host": record.host,
                "port": record.port,
                "resource_type": record.resource_type,
                "resource_id": record.resource_id,
                "action": record.action,
                "created_at": record.created_at,
                "expires_at": record.expires_at,
            },
        )

    async def spend(self, tunnel_id: str, *, secret_hash: bytes, now: dt.datetime) -> TunnelRecord | None:
        """Mark the ticket used, once (see ``Tunnels.spend``)."""
        rows = await self._fetch(self._spend, {"id": tunnel_id, "secret_hash": secret_hash, "now": now})
        return _record(rows[0]) if rows else None

    async def get(self, tunnel_id: str) -> TunnelRecord | None:
        """A tunnel by id."""
        rows = await self._fetch(self._get, {"id": tunnel_id})
        return _record(rows[0]) if rows else None

    async def checked(self, ids: Sequence[str], *, now: dt.datetime) -> list[TunnelRecord]:
        """The tunnels of these ids, marked checked now, in one statement."""
        if not ids:
            return []
        return [_record(r) for r in await self._fetch(self._check, {"ids": list(ids), "now": now})]

    async def sweep(self, *, stale_before: dt.datetime, now: dt.datetime, limit: int) -> list[TunnelRecord]:
        """Close, in one statement, tickets never used that expired and tunnels unchecked since ``stale_before``."""
        params = {"stale_before": stale_before, "now": now, "limit": limit}
        return [_record(r) for r in await self._fetch(self._sweep, params)]

    async def close(
        self, tunnel_id: str, *, reason: str, bytes_up: int, bytes_down: int, now: dt.datetime
    ) -> TunnelRecord | None:
        """Record the end of a tunnel, once."""
        params = {"id": tunnel_id, "reason": reason, "bytes_up": bytes_up, "bytes_down": bytes_down, "now": now}
        rows = await self._fetch(self._close, params)
        return _record(rows[0]) if rows else None
