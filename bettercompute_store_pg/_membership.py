"""Worker membership rows; a heartbeat is one statement that also returns the live members."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from typing import Any

from bettercompute.ports import Member

from ._db import Database, utc

__all__ = ["PgMembership"]

_COLUMNS = "role, id, instance, started_at, heartbeat_at, expires_at"

# The sweep never touches this worker's own rows, so the upsert and the delete never meet on one row.
_HEARTBEAT = f"""
WITH up AS (
    INSERT INTO {{s}}.workers AS w (role, id, instance, started_at, heartbeat_at, expires_at)
    SELECT r.role, :id, :instance, now(), now(), now() + :ttl FROM unnest(CAST(:roles AS text[])) AS r(role)
    ON CONFLICT (role, id) DO UPDATE SET
        instance = EXCLUDED.instance, heartbeat_at = now(), expires_at = EXCLUDED.expires_at
    RETURNING {_COLUMNS}
), swept AS (
    DELETE FROM {{s}}.workers WHERE expires_at < now() - interval '10 minutes' AND id <> :id
)
SELECT {_COLUMNS} FROM up
UNION ALL
SELECT {_COLUMNS} FROM {{s}}.workers
WHERE role = ANY(CAST(:roles AS text[])) AND id <> :id AND expires_at > now()
"""

_LEAVE = "DELETE FROM {s}.workers WHERE role = ANY(CAST(:roles AS text[])) AND id = :id"

_LIVE = f"SELECT {_COLUMNS} FROM {{s}}.workers WHERE role = :role AND expires_at > now() ORDER BY id"


def _member(row: Any) -> Member:
    return Member(
        role=row.role,
        id=row.id,
        instance=row.instance,
        started_at=utc(row.started_at),
        heartbeat_at=utc(row.heartbeat_at),
        expires_at=utc(row.expires_at),
    )


class PgMembership:
    """``bettercompute.ports.Membership`` on the ``workers`` table."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._heartbeat = db.sql(_HEARTBEAT)
        self._leave = db.sql(_LEAVE)
        self._live = db.sql(_LIVE)

    async def heartbeat(self, *, roles: Collection[str], id: str, instance: str, ttl: dt.timedelta) -> list[Member]:
        """Register or refresh ``id`` in ``roles``; the live members of those roles, by role and id."""
        if not roles:
            return []
        params = {"roles": sorted(set(roles)), "id": id, "instance": instance, "ttl": ttl}
        rows = await self._db.fetch(self._heartbeat, params)
        return sorted((_member(row) for row in rows), key=lambda m: (m.role, m.id))

    async def leave(self, *, roles: Collection[str], id: str) -> None:
        """Delete ``id``'s rows in ``roles``."""
        if roles:
            await self._db.rowcount(self._leave, {"roles": sorted(set(roles)), "id": id})

    async def live(self, role: str) -> list[Member]:
        """The unexpired members of ``role``, by id."""
        return [_member(row) for row in await self._db.fetch(self._live, {"role": role})]
