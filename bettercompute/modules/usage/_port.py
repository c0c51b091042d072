"""Bookings of capacity and the usage accounted from them."""

from __future__ import annotations

import datetime as dt
from typing import Protocol

import attrs

from bettercompute.ports import Repository

__all__ = ["BOOKINGS", "USAGE_RECORDS", "Booking", "Bookings", "Usage", "UsageRecord"]


@attrs.frozen(kw_only=True)
class Booking:
    """A unit of capacity (an atom: a GPU, a MIG slice, a vCPU/GiB unit) held by a reservation for ``[start, end)``
    (``end`` ``None``: until released). ``gpus`` is the atom's share of a GPU (1 for a GPU, a fraction for a MIG
    slice, 0 for vCPU and memory units): usage counts ``gpus`` times seconds."""

    id: int
    atom_id: str
    reservation_id: str
    tenant: str
    pool_id: str
    gpus: float
    start: dt.datetime
    end: dt.datetime | None


@attrs.frozen(kw_only=True)
class UsageRecord:
    """GPU-seconds a tenant used in a pool during ``[period_start, period_end)``."""

    tenant: str
    pool_id: str
    period_start: dt.datetime
    period_end: dt.datetime
    gpu_seconds: float


class Bookings(Protocol):
    """Bookings of atoms by reservations. The store refuses two bookings of one atom whose times overlap, whatever
    the timing (PostgreSQL: an exclusion constraint), among the bookings not yet moved to history. ``book`` and
    ``release`` need a transaction (``tx.repository(BOOKINGS)``).

    ``move_to_history`` takes bookings that ended long enough ago out of the live bookings, which the overlap check
    and placement search (PostgreSQL: the exclusion constraint's gist index, which degrades under churn). A moved
    booking is still a booking to every reader of ended ones (``for_reservation``, usage accounting, booked GPU-hours,
    quota sums), but no longer refuses an overlapping one: move only bookings that ended before any new booking may
    start.
    """

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
        """Book ``atom_id`` for ``[start, end)``; ``ConflictError`` when it is booked for an overlapping time."""
        ...

    async def release(self, *, reservation_id: str, at: dt.datetime) -> int:
        """End the reservation's bookings at ``at`` (those ending later or never); returns how many changed."""
        ...

    async def for_reservation(self, reservation_id: str) -> list[Booking]:
        """The reservation's bookings, live and moved to history, by id."""
        ...

    async def move_to_history(self, *, ended_by: dt.datetime, limit: int) -> int:
        """Move at most ``limit`` bookings that ended by ``ended_by`` and by the usage watermark
        (``Usage.accounted_until``; none before the first accounting pass) to history, as one atomic step; returns
        how many moved. Safe to run concurrently with itself and with anything else: a booking is moved once, and
        every reader sees it either live or in history, never both nor neither."""
        ...


class Usage(Protocol):
    """Usage records, computed from bookings per closed period. Recomputing a period replaces its records, so an
    accounting pass may run again over the same periods without counting anything twice; it counts the bookings moved
    to history too. All but ``records`` need a transaction (``tx.repository(USAGE_RECORDS)``), the one an accounting
    pass runs in."""

    async def accounted_until(self) -> dt.datetime | None:
        """The end of the last period accounted (locked until the transaction ends), ``None`` before the first
        pass."""
        ...

    async def earliest_booking(self) -> dt.datetime | None:
        """The start of the earliest booking, ``None`` when there is none."""
        ...

    async def account(self, *, start: dt.datetime, end: dt.datetime, period: dt.timedelta) -> int:
        """(Re)compute the records of every period of length ``period`` in ``[start, end)`` (``start`` aligned) and
        set ``accounted_until`` to ``end``; returns how many records were written."""
        ...

    async def records(
        self, *, tenant: str, since: dt.datetime, until: dt.datetime, pool_id: str | None = None
    ) -> list[UsageRecord]:
        """The tenant's records of periods starting in ``[since, until)``, by period then pool."""
        ...


BOOKINGS: Repository[Bookings] = Repository(module="usage", name="bookings")
"""``tx.repository(BOOKINGS)`` in a transaction, ``store.repository(BOOKINGS)`` outside one: the store's ``Bookings``"""
USAGE_RECORDS: Repository[Usage] = Repository(module="usage", name="usage")
"""``tx.repository(USAGE_RECORDS)`` in a transaction, ``store.repository(USAGE_RECORDS)`` outside one: the store's
``Usage``"""
