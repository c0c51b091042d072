"""Quota rows (``Quotas``) and the capacity reads over atoms and bookings (``CapacityReads``).

The capacity reads are two statements whatever the pool's size: one groups the pool's atoms by model, state and
reason with the bookings that hold them now; the other clips the bookings overlapping the window to each UTC day and
sums GPU-hours per day and model, from the live bookings and those moved to history. They read the inventory's
``atoms`` and the usage module's ``bookings`` and ``bookings_history`` tables.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from bettercompute.modules.capacity import AtomCount, BookedHours, QuotaRecord
from bettercompute_store_pg._db import Database, utc
from bettercompute_store_pg._repository import PgRepository

__all__ = ["REPOSITORIES", "PgCapacityReads", "PgQuotas"]

_COLUMNS = "pool_id, tenant, max_gpus, max_gpu_hours_per_month, max_reservation_hours, updated_at"

_PUT = f"""
INSERT INTO {{s}}.quotas (pool_id, tenant, max_gpus, max_gpu_hours_per_month, max_reservation_hours)
VALUES (:pool_id, :tenant, :max_gpus, :max_hours, :max_reservation_hours)
ON CONFLICT (pool_id, tenant) DO UPDATE SET
    max_gpus = excluded.max_gpus, max_gpu_hours_per_month = excluded.max_gpu_hours_per_month,
    max_reservation_hours = excluded.max_reservation_hours, updated_at = now()
RETURNING {_COLUMNS}
"""

# The tenant's own row sorts before the default's ('' is the default).
_EFFECTIVE = f"""
SELECT {_COLUMNS} FROM {{s}}.quotas
WHERE pool_id = :pool_id AND tenant IN (:tenant, '')
ORDER BY tenant = '' LIMIT 1
"""

_LIST = f"""
SELECT {_COLUMNS} FROM {{s}}.quotas
WHERE pool_id = :pool_id AND (CAST(:after AS text) IS NULL OR tenant > :after)
ORDER BY tenant LIMIT :limit
"""

# An atom has at most one booking at a moment (the bookings' exclusion constraint).
_ATOMS = """
SELECT a.model, a.state, a.reason, count(*) AS atoms, count(b.atom_id) AS booked,
    coalesce(sum(b.gpus), 0)::float8 AS booked_gpus
FROM {s}.atoms AS a
LEFT JOIN {s}.bookings AS b ON b.atom_id = a.id AND b.during @> CAST(:at AS timestamptz)
WHERE a.pool_id = :pool_id
GROUP BY a.model, a.state, a.reason
"""

# Each UTC day of the window, clipped to it; each booking overlapping the window (live or moved to history: found
# there by its end), clipped to each day it touches.
_HOURS = """
WITH booked AS (
    SELECT atom_id, gpus, during FROM {s}.bookings
    WHERE pool_id = :pool_id AND during && tstzrange(:start, :end)
    UNION ALL
    SELECT atom_id, gpus, during FROM {s}.bookings_history
    WHERE pool_id = :pool_id AND upper(during) >= :start AND during && tstzrange(:start, :end)
), days AS (
    SELECT d AS day, tstzrange(greatest(d, :start), least(d + interval '1 day', :end)) AS span
    FROM generate_series(
        date_trunc('day', CAST(:start AS timestamptz), 'UTC'), CAST(:end AS timestamptz) - interval '1 microsecond',
        interval '1 day'
    ) AS d
)
SELECT days.day, a.model,
    sum(b.gpus * extract(epoch FROM upper(b.during * days.span) - lower(b.during * days.span)))::float8 / 3600
        AS gpu_hours
FROM booked AS b
JOIN days ON b.during && days.span
LEFT JOIN {s}.atoms AS a ON a.id = b.atom_id
GROUP BY days.day, a.model
HAVING sum(b.gpus) > 0
ORDER BY days.day, a.model
"""


def _record(row: Any) -> QuotaRecord:
    return QuotaRecord(
        pool_id=row.pool_id,
        tenant=row.tenant or None,
        max_gpus=row.max_gpus,
        max_gpu_hours_per_month=row.max_gpu_hours_per_month,
        max_reservation_hours=row.max_reservation_hours,
        updated_at=utc(row.updated_at),
    )


class PgQuotas(PgRepository):
    """``Quotas`` on the ``quotas`` table; one statement per call."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._put = db.sql(_PUT)
        self._effective = db.sql(_EFFECTIVE)
        self._list = db.sql(_LIST)

    async def put(
        self,
        *,
        pool_id: str,
        tenant: str | None,
        max_gpus: int | None,
        max_gpu_hours_per_month: float | None,
        max_reservation_hours: int | None = None,
    ) -> QuotaRecord:
        """Insert or replace a row in the caller's transaction."""
        params = {
            "pool_id": pool_id,
            "tenant": tenant or "",
            "max_gpus": max_gpus,
            "max_hours": max_gpu_hours_per_month,
            "max_reservation_hours": max_reservation_hours,
        }
        rows = await self._fetch_in_transaction("put", self._put, params)
        return _record(rows[0])

    async def effective(self, pool_id: str, tenant: str) -> QuotaRecord | None:
        """The tenant's row, else the pool's default row."""
        rows = await self._fetch(self._effective, {"pool_id": pool_id, "tenant": tenant})
        return _record(rows[0]) if rows else None

    async def for_pool(self, pool_id: str, *, after: Sequence[Any] | None, limit: int) -> list[QuotaRecord]:
        """The pool's rows by tenant (the default first), after ``after``."""
        params = {"pool_id": pool_id, "after": after[0] if after is not None else None, "limit": limit}
        rows = await self._fetch(self._list, params)
        return [_record(row) for row in rows]


class PgCapacityReads(PgRepository):
    """``CapacityReads`` over ``atoms``, ``bookings`` and ``bookings_history``; one statement per call."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._atoms = db.sql(_ATOMS)
        self._hours = db.sql(_HOURS)

    async def atoms(self, pool_id: str, *, at: dt.datetime) -> list[AtomCount]:
        """The pool's atoms by model, state and reason, with what is booked at ``at``."""
        rows = await self._fetch(self._atoms, {"pool_id": pool_id, "at": at})
        return [
            AtomCount(
                model=row.model,
                state=row.state,
                reason=row.reason,
                atoms=row.atoms,
                booked=row.booked,
                booked_gpus=float(row.booked_gpus),
            )
            for row in rows
        ]

    async def booked_hours(self, pool_id: str, *, start: dt.datetime, end: dt.datetime) -> list[BookedHours]:
        """GPU-hours booked in ``[start, end)`` per UTC day and model."""
        rows = await self._fetch(self._hours, {"pool_id": pool_id, "start": start, "end": end})
        return [BookedHours(day=utc(row.day), model=row.model, gpu_hours=float(row.gpu_hours)) for row in rows]


REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {
    "quotas": PgQuotas,
    "capacity": PgCapacityReads,
}
"""The adapters of this module's repositories, by ``Repository.name``."""
