"""Reservations' bookings moved to history still count: a pool's booked GPU-hours, usage records and the quota's
GPU-hours per month are the same before and after the move, while placement and the exclusion constraint still see
every live booking."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from bettercompute.errors import ConflictError, NoCapacityError, QuotaExceededError
from bettercompute.modules.capacity import GetCapacityInput, QuotasGroup, SetQuotaInput
from bettercompute.modules.reservations import CreateReservationInput, ReservationsGroup
from bettercompute.modules.usage import BOOKINGS, USAGE_RECORDS, account_usage, move_ended_bookings

from .conftest import NOW, Plane, seed_fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

HOUR = dt.timedelta(hours=1)


async def _where(plane: Plane) -> dict[str, int]:
    store = plane.t.store
    rows = await store.fetch(
        store.sql(
            "SELECT (SELECT count(*) FROM {s}.bookings) AS live, (SELECT count(*) FROM {s}.bookings_history) AS h"
        ),
        {},
    )
    return {"live": rows[0].live, "history": rows[0].h}


async def _month_used(plane: Plane, pool: str) -> Any:
    """What the quota check counts as the tenant's GPU-hours this month (a zero limit, so it always says)."""
    store = plane.t.store
    rows = await store.fetch(
        store.sql(
            "SELECT {s}.bc_quota_check(:pool, :tenant, tstzrange(:start, :end), 1, NULL, 0, '') ->> 'used' AS used"
        ),
        {"pool": pool, "tenant": plane.t.acme, "start": NOW + 20 * HOUR, "end": NOW + 21 * HOUR},
    )
    return float(rows[0].used)


async def test_moved_bookings_still_count_for_capacity_usage_and_quota(plane: Plane, database_url: str) -> None:
    t = plane.t
    pool = await plane.pool()
    seed_fleet(database_url, t.store.schema, tenant=t.acme, pool=pool, nodes=1, gpus=8)
    reservations: ReservationsGroup[Any] = t.compute.api.group(ReservationsGroup)
    quotas: QuotasGroup[Any] = t.compute.api.group(QuotasGroup)
    await quotas.set(t.alice, SetQuotaInput(pool_id=pool, max_gpu_hours_per_month=30))
    # 8 GPU-hours that end at 14:00, and 12 that run until 18:00.
    ended = await reservations.create(
        t.alice, CreateReservationInput(tenant=t.acme, pool_id=pool, gpus=4, duration="PT2H")
    )
    live = await reservations.create(
        t.alice, CreateReservationInput(tenant=t.acme, pool_id=pool, gpus=2, duration="PT6H")
    )

    plane.clock.set(NOW + 4 * HOUR + dt.timedelta(minutes=10))
    await account_usage(t.compute.context)  # accounted until 16:00
    window = GetCapacityInput(pool_id=pool, start=NOW - HOUR, days=1)
    capacity = await plane.capacity.get(t.alice, window)
    assert capacity.gpu_hours == pytest.approx(20.0)
    records = await t.store.repository(USAGE_RECORDS).records(tenant=t.acme, since=NOW, until=NOW + 24 * HOUR)
    assert await _month_used(plane, pool) == pytest.approx(20.0)
    bookings = await t.store.repository(BOOKINGS).for_reservation(ended.id)
    assert len(bookings) == 4

    assert await move_ended_bookings(t.compute.context) == 4
    assert await _where(plane) == {"live": 2, "history": 4}

    after = await plane.capacity.get(t.alice, window)
    assert (after.gpu_hours, after.days, after.models) == (capacity.gpu_hours, capacity.days, capacity.models)
    assert await _month_used(plane, pool) == pytest.approx(20.0)
    assert await t.store.repository(BOOKINGS).for_reservation(ended.id) == bookings
    # Every hour accounted again (as after a crash) from both tables: the same records.
    await t.store.fetch(t.store.sql("UPDATE {s}.usage_state SET accounted_until = :at"), {"at": NOW - HOUR})
    await account_usage(t.compute.context)
    again = await t.store.repository(USAGE_RECORDS).records(tenant=t.acme, since=NOW, until=NOW + 24 * HOUR)
    assert [(r.period_start, r.gpu_seconds) for r in again] == [(r.period_start, r.gpu_seconds) for r in records]

    # The quota still counts the moved hours: 20 used, so 12 more is over 30, 10 more is not.
    with pytest.raises(QuotaExceededError) as refused:
        await reservations.create(t.alice, CreateReservationInput(tenant=t.acme, pool_id=pool, gpus=2, duration="PT6H"))
    assert (refused.value.details["limit"], float(refused.value.details["used"])) == ("max_gpu_hours_per_month", 20.0)

    # Placement and the exclusion constraint still see the live bookings: the node's 8 GPUs are not all free, and
    # a live atom cannot be booked twice.
    with pytest.raises(NoCapacityError):
        await reservations.create(t.alice, CreateReservationInput(tenant=t.acme, pool_id=pool, gpus=8, duration="PT1H"))
    held = await t.store.repository(BOOKINGS).for_reservation(live.id)
    with pytest.raises(ConflictError):
        async with t.store.transaction() as tx:
            await tx.repository(BOOKINGS).book(
                atom_id=held[0].atom_id,
                reservation_id="r-double",
                tenant=t.acme,
                pool_id=pool,
                gpus=1.0,
                start=NOW + 5 * HOUR,
                end=NOW + 7 * HOUR,
            )
    fits = await reservations.create(
        t.alice, CreateReservationInput(tenant=t.acme, pool_id=pool, gpus=2, duration="PT5H")
    )
    assert fits.state == "placed"
