"""Quotas per pool and tenant, and the pool's capacity as atoms and bookings show it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from bettercompute.ports import Repository

__all__ = ["CAPACITY", "QUOTAS", "AtomCount", "BookedHours", "CapacityReads", "QuotaRecord", "Quotas"]


@attrs.frozen(kw_only=True)
class QuotaRecord:
    """A stored quota row of a pool: ``tenant`` ``None`` is the pool's default. A limit ``None`` is unlimited."""

    pool_id: str
    tenant: str | None
    max_gpus: int | None
    max_gpu_hours_per_month: float | None
    max_reservation_hours: int | None = None
    updated_at: dt.datetime


@attrs.frozen(kw_only=True)
class AtomCount:
    """How many atoms of a pool share a model, a state and a reason (``model`` and ``reason`` may be ``None``), how
    many of them are booked at the moment asked, and the GPUs those bookings hold."""

    model: str | None
    state: str
    reason: str | None
    atoms: int
    booked: int
    booked_gpus: float


@attrs.frozen(kw_only=True)
class BookedHours:
    """GPU-hours booked on a pool's atoms of one model (``None``: unknown) within the UTC day starting at ``day``,
    clipped to the window asked."""

    day: dt.datetime
    model: str | None
    gpu_hours: float


class Quotas(Protocol):
    """Quota rows (the ``quotas`` group's state). Writes need a transaction (``tx.repository(QUOTAS)``)."""

    async def put(
        self,
        *,
        pool_id: str,
        tenant: str | None,
        max_gpus: int | None,
        max_gpu_hours_per_month: float | None,
        max_reservation_hours: int | None = None,
    ) -> QuotaRecord:
        """Insert or replace the row of ``(pool_id, tenant)`` (``tenant`` ``None``: the pool's default)."""
        ...

    async def effective(self, pool_id: str, tenant: str) -> QuotaRecord | None:
        """The tenant's own row, else the pool's default row, else ``None``."""
        ...

    async def for_pool(self, pool_id: str, *, after: Sequence[Any] | None, limit: int) -> list[QuotaRecord]:
        """The pool's rows, the default first and then by tenant: at most ``limit``, after the key ``after`` (the
        tenant, ``""`` for the default)."""
        ...


class CapacityReads(Protocol):
    """Reads over the inventory's atoms and the usage module's bookings (their tables exist with node identity)."""

    async def atoms(self, pool_id: str, *, at: dt.datetime) -> list[AtomCount]:
        """The pool's atoms grouped by model, state and reason, with what is booked at ``at``; one statement."""
        ...

    async def booked_hours(self, pool_id: str, *, start: dt.datetime, end: dt.datetime) -> list[BookedHours]:
        """GPU-hours booked in ``[start, end)`` per UTC day and model (only non-zero groups); one statement."""
        ...


QUOTAS: Repository[Quotas] = Repository(module="capacity", name="quotas")
CAPACITY: Repository[CapacityReads] = Repository(module="capacity", name="capacity")
