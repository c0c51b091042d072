"""Bookings and usage records (``Bookings`` and ``Usage``).

``bookings.during`` is a ``tstzrange`` under an exclusion constraint (``atom_id WITH =, during WITH &&``, which needs
the ``btree_gist`` extension), so PostgreSQL itself refuses a double booking. ``account`` computes every period of
``[start, end)`` in one statement (``generate_series`` of the periods joined to the bookings overlapping each,
summing share times overlapping seconds per tenant and pool) and upserts the records, so recomputing a period replaces
what it wrote before; the watermark moves in the same transaction.

``move_to_history`` moves a batch of ended bookings to ``bookings_history`` in one statement (a ``DELETE ...
RETURNING`` feeding an ``INSERT``), so a booking is always in exactly one of the two tables for any reader's
snapshot; the batch's rows are locked ``SKIP LOCKED``, so two moves at once take different rows. Readers of ended
bookings read both tables: ``bookings`` by its gist index, ``bookings_history`` by btree indexes on the bookings' end
(``upper(during) >= start`` finds every range overlapping a window from ``start``; the overlap test itself follows).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from bettercompute.modules.usage import Booking, UsageRecord
from bettercompute_store_pg._db import Database, utc
from bettercompute_store_pg._repository import PgRepository

__all__ = ["REPOSITORIES", "PgBookings", "PgUsage"]

_BOOKING_COLUMNS = (
    "id, atom_id, reservation_id, tenant, pool_id, gpus, lower(during) AS start_at, upper(during) AS end_at"
)

_BOOK = f"""
INSERT INTO {{s}}.bookings (atom_id, reservation_id, tenant, pool_id, gpus, during)
VALUES (:atom_id, :reservation_id, :tenant, :pool_id, :gpus,
    tstzrange(CAST(:start AS timestamptz), CAST(:end AS timestamptz), '[)'))
RETURNING {_BOOKING_COLUMNS}
"""

_RELEASE = """
UPDATE {s}.bookings SET during = tstzrange(lower(during), greatest(lower(during), CAST(:at AS timestamptz)), '[)')
WHERE reservation_id = :reservation_id AND (upper_inf(during) OR upper(during) > :at)
RETURNING id
"""

_FOR_RESERVATION = f"""
SELECT {_BOOKING_COLUMNS} FROM {{s}}.bookings WHERE reservation_id = :reservation_id
UNION ALL
SELECT {_BOOKING_COLUMNS} FROM {{s}}.bookings_history WHERE reservation_id = :reservation_id
ORDER BY id
"""

# The cutoff is the earlier of ``ended_by`` and the watermark; no watermark row (no accounting pass yet), no cutoff
# and nothing moves. ``during << [cutoff, )`` (wholly before the cutoff: ended by it, for the ``[)`` ranges bookings
# are) is what the gist index on ``during`` answers.
_MOVE_TO_HISTORY = """
WITH cutoff AS (
    SELECT least(st.accounted_until, CAST(:ended_by AS timestamptz)) AS at FROM {s}.usage_state AS st WHERE st.id
), due AS (
    SELECT b.id FROM {s}.bookings AS b, cutoff
    WHERE b.during << tstzrange(cutoff.at, NULL, '[)')
    LIMIT :limit
    FOR UPDATE OF b SKIP LOCKED
), moved AS (
    DELETE FROM {s}.bookings AS b USING due WHERE b.id = due.id
    RETURNING b.*
), kept AS (
    INSERT INTO {s}.bookings_history SELECT * FROM moved
    RETURNING 1
)
SELECT count(*) AS n FROM kept
"""

_WATERMARK = "SELECT accounted_until FROM {s}.usage_state WHERE id FOR UPDATE"

# Asked only before the first pass, when nothing was moved yet; history is read anyway, should the watermark be
# reset by hand.
_EARLIEST = """
SELECT least(
    (SELECT min(lower(during)) FROM {s}.bookings), (SELECT min(lower(during)) FROM {s}.bookings_history)
) AS earliest
"""

# Periods with no booking get no record; a period recomputed to nothing loses the records it had.
_ACCOUNT = """
WITH periods AS (
    SELECT p AS period_start, p + CAST(:period AS interval) AS period_end
    FROM generate_series(CAST(:start AS timestamptz), CAST(:end AS timestamptz) - CAST(:period AS interval),
                         CAST(:period AS interval)) AS p
),
booked AS (
    SELECT tenant, pool_id, gpus, during FROM {s}.bookings
    WHERE during && tstzrange(CAST(:start AS timestamptz), CAST(:end AS timestamptz), '[)')
    UNION ALL
    SELECT tenant, pool_id, gpus, during FROM {s}.bookings_history
    WHERE upper(during) >= CAST(:start AS timestamptz)
      AND during && tstzrange(CAST(:start AS timestamptz), CAST(:end AS timestamptz), '[)')
),
used AS (
    SELECT b.tenant, b.pool_id, p.period_start, p.period_end,
        sum(b.gpus * extract(epoch FROM
            least(coalesce(upper(b.during), 'infinity'), p.period_end) - greatest(lower(b.during), p.period_start)
        )) AS gpu_seconds
    FROM periods AS p
    JOIN booked AS b ON b.during && tstzrange(p.period_start, p.period_end, '[)')
    GROUP BY b.tenant, b.pool_id, p.period_start, p.period_end
),
cleared AS (
    DELETE FROM {s}.usage_records AS r
    WHERE r.period_start >= CAST(:start AS timestamptz) AND r.period_start < CAST(:end AS timestamptz)
      AND NOT EXISTS (
          SELECT 1 FROM used AS u
          WHERE u.tenant = r.tenant AND u.pool_id = r.pool_id AND u.period_start = r.period_start
      )
),
written AS (
    INSERT INTO {s}.usage_records AS r (tenant, pool_id, period_start, period_end, gpu_seconds)
    SELECT tenant, pool_id, period_start, period_end, gpu_seconds FROM used
    ON CONFLICT (tenant, pool_id, period_start) DO UPDATE
        SET gpu_seconds = EXCLUDED.gpu_seconds, period_end = EXCLUDED.period_end, computed_at = now()
    RETURNING 1
),
moved AS (
    INSERT INTO {s}.usage_state AS st (id, accounted_until) VALUES (true, CAST(:end AS timestamptz))
    ON CONFLICT (id) DO UPDATE SET accounted_until = greatest(st.accounted_until, EXCLUDED.accounted_until)
)
SELECT count(*) AS n FROM written
"""

_RECORDS = """
SELECT tenant, pool_id, period_start, period_end, gpu_seconds FROM {s}.usage_records
WHERE tenant = :tenant AND period_start >= :since AND period_start < :until
  AND (CAST(:pool_id AS text) IS NULL OR pool_id = :pool_id)
ORDER BY period_start, pool_id
"""


def _booking(row: Any) -> Booking:
    return Booking(
        id=row.id,
        atom_id=row.atom_id,
        reservation_id=row.reservation_id,
        tenant=row.tenant,
        pool_id=row.pool_id,
        gpus=float(row.gpus),
        start=utc(row.start_at),
        end=utc(row.end_at) if row.end_at is not None else None,
    )


class PgBookings(PgRepository):
    """``Bookings`` on the ``bookings`` table (the usage module's migrations)."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._book = db.sql(_BOOK)
        self._release = db.sql(_RELEASE)
        self._for_reservation = db.sql(_FOR_RESERVATION)
        self._move_to_history = db.sql(_MOVE_TO_HISTORY)

    async def book(
        self,
        *,
        atom_id: str,
        reservation_id: str,
        tenant: str,
        pool_id: str,
        gpus: float,
        start: dt.datetime,
        end: dt.datetime | None,
    ) -> Booking:
        """Book an atom; an overlapping booking of it is ``ConflictError`` (the store boundary maps the exclusion
        violation)."""
        params = {
            "atom_id": atom_id,
            "reservation_id": reservation_id,
            "tenant": tenant,
            "pool_id": pool_id,
            "gpus": gpus,
            "start": start,
            "end": end,
        }
        rows = await self._fetch_in_transaction("book", self._book, params)
        return _booking(rows[0])

    async def release(self, *, reservation_id: str, at: dt.datetime) -> int:
        """End the reservation's bookings at ``at``."""
        return len(
            await self._fetch_in_transaction("release", self._release, {"reservation_id": reservation_id, "at": at})
        )

    async def for_reservation(self, reservation_id: str) -> list[Booking]:
        """The reservation's bookings, from both tables."""
        return [_booking(r) for r in await self._fetch(self._for_reservation, {"reservation_id": reservation_id})]

    async def move_to_history(self, *, ended_by: dt.datetime, limit: int) -> int:
        """One statement, in the bound transaction or on its own."""
        rows = await self._fetch(self._move_to_history, {"ended_by": ended_by, "limit": limit})
        return int(rows[0].n)


class PgUsage(PgRepository):
    """``Usage`` on ``usage_records`` and the one-row ``usage_state`` (the usage module's migrations)."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._watermark = db.sql(_WATERMARK)
        self._earliest = db.sql(_EARLIEST)
        self._account = db.sql(_ACCOUNT)
        self._records = db.sql(_RECORDS)

    async def accounted_until(self) -> dt.datetime | None:
        """The watermark, locked until the transaction ends."""
        rows = await self._fetch_in_transaction("accounted_until", self._watermark, {})
        return utc(rows[0].accounted_until) if rows else None

    async def earliest_booking(self) -> dt.datetime | None:
        """The earliest booking's start."""
        rows = await self._fetch_in_transaction("earliest_booking", self._earliest, {})
        return utc(rows[0].earliest) if rows and rows[0].earliest is not None else None

    async def account(self, *, start: dt.datetime, end: dt.datetime, period: dt.timedelta) -> int:
        """Recompute the periods of ``[start, end)`` and move the watermark to ``end``."""
        rows = await self._fetch_in_transaction(
            "account", self._account, {"start": start, "end": end, "period": period}
        )
        return int(rows[0].n)

    async def records(
        self, *, tenant: str, since: dt.datetime, until: dt.datetime, pool_id: str | None = None
    ) -> list[UsageRecord]:
        """The tenant's records."""
        params = {"tenant": tenant, "since": since, "until": until, "pool_id": pool_id}
        return [
            UsageRecord(
                tenant=r.tenant,
                pool_id=r.pool_id,
                period_start=utc(r.period_start),
                period_end=utc(r.period_end),
                gpu_seconds=float(r.gpu_seconds),
            )
            for r in await self._fetch(self._records, params)
        ]


REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {"bookings": PgBookings, "usage": PgUsage}
"""The adapters of this module's repositories, by ``Repository.name``."""
