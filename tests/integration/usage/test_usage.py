"""Bookings and the usage job against PostgreSQL: no double booking, GPU-seconds per tenant, pool and hour, and a
rerun (or a crash and a rerun) that never counts anything twice."""

from __future__ import annotations

import datetime as dt

import anyio
import pytest

from bettercompute.errors import ConflictError
from bettercompute.modules.usage import BOOKINGS, HISTORY_MARGIN, USAGE_RECORDS, account_usage, move_ended_bookings

from ..joins.conftest import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

DAY = dt.datetime(2031, 3, 4, tzinfo=dt.UTC)


def at(hour: int, minute: int = 0) -> dt.datetime:
    return DAY + dt.timedelta(hours=hour, minutes=minute)


async def _book(
    fleet: Fleet,
    atom: str,
    reservation: str,
    start: dt.datetime,
    end: dt.datetime | None,
    *,
    tenant: str = "t-a",
    pool: str = "p-1",
    gpus: float = 1.0,
) -> None:
    async with fleet.store.transaction() as tx:
        await tx.repository(BOOKINGS).book(
            atom_id=atom, reservation_id=reservation, tenant=tenant, pool_id=pool, gpus=gpus, start=start, end=end
        )


async def _usage(fleet: Fleet, tenant: str) -> list[tuple[int, str, float]]:
    records = await fleet.store.repository(USAGE_RECORDS).records(tenant=tenant, since=at(0), until=at(48))
    # gpus is stored with 6 decimals (1/7 -> 0.142857): compare to a tenth of a GPU-second.
    return [(int((r.period_start - DAY).total_seconds() // 3600), r.pool_id, round(r.gpu_seconds, 1)) for r in records]


async def test_gpu_seconds_per_tenant_pool_and_hour_counted_once_however_often_the_job_runs(fleet: Fleet) -> None:
    await _book(fleet, "gpu-1", "r-1", at(10, 30), at(12, 15))
    await _book(fleet, "mig-1/3", "r-2", at(11), None, gpus=1 / 7)
    await _book(fleet, "gpu-2", "r-3", at(11, 45), at(11, 50), tenant="t-b")
    await _book(fleet, "vcpu-1", "r-4", at(10), at(14), pool="p-vps", gpus=0)

    fleet.clock.set(at(12, 4))  # the 11:00 hour closed, but less than the grace period ago
    await account_usage(fleet.compute.context)
    assert await _usage(fleet, "t-a") == [(10, "p-1", 1800.0), (10, "p-vps", 0.0)]

    fleet.clock.set(at(12, 10))
    await account_usage(fleet.compute.context)
    expected_a = [(10, "p-1", 1800.0), (10, "p-vps", 0.0), (11, "p-1", round(3600 + 3600 / 7, 1)), (11, "p-vps", 0.0)]
    assert await _usage(fleet, "t-a") == expected_a
    assert await _usage(fleet, "t-b") == [(11, "p-1", 300.0)]

    # Again, and again from an earlier watermark (as after a crash): the same numbers, nothing added.
    assert await account_usage(fleet.compute.context) == 0
    await fleet.store.fetch(fleet.store.sql("UPDATE {s}.usage_state SET accounted_until = :at"), {"at": at(9)})
    await account_usage(fleet.compute.context)
    assert await _usage(fleet, "t-a") == expected_a
    assert await _usage(fleet, "t-b") == [(11, "p-1", 300.0)]

    # The MIG slice is released at 12:30; the 12:00 hour is accounted once it closed.
    async with fleet.store.transaction() as tx:
        assert await tx.repository(BOOKINGS).release(reservation_id="r-2", at=at(12, 30)) == 1
    fleet.clock.set(at(13, 6))
    await fleet.compute.jobs.tick()
    assert (await _usage(fleet, "t-a"))[4:] == [(12, "p-1", round(900 + 1800 / 7, 1)), (12, "p-vps", 0.0)]


async def test_a_late_change_to_the_last_hour_is_picked_up_and_replaces_its_numbers(fleet: Fleet) -> None:
    await _book(fleet, "gpu-1", "r-1", at(10), None)
    fleet.clock.set(at(11, 10))
    await account_usage(fleet.compute.context)
    assert await _usage(fleet, "t-a") == [(10, "p-1", 3600.0)]
    # A release at 10:20 recorded late (after the hour was accounted): the next pass recounts that hour.
    async with fleet.store.transaction() as tx:
        await tx.repository(BOOKINGS).release(reservation_id="r-1", at=at(10, 20))
    fleet.clock.set(at(12, 10))
    await account_usage(fleet.compute.context)
    assert await _usage(fleet, "t-a") == [(10, "p-1", 1200.0)]


async def test_the_database_refuses_a_double_booking_even_from_racing_writers(fleet: Fleet) -> None:
    await _book(fleet, "gpu-1", "r-1", at(10), at(12))
    with pytest.raises(ConflictError):
        await _book(fleet, "gpu-1", "r-2", at(11), at(13))
    await _book(fleet, "gpu-1", "r-3", at(12), at(13))  # back to back is fine: [10, 12) and [12, 13)
    outcomes: list[str] = []

    async def race(reservation: str) -> None:
        try:
            await _book(fleet, "gpu-9", reservation, at(20), None)
            outcomes.append("booked")
        except ConflictError:
            outcomes.append("conflict")

    async with anyio.create_task_group() as tg:
        for n in range(4):
            tg.start_soon(race, f"race-{n}")
    assert sorted(outcomes) == ["booked", "conflict", "conflict", "conflict"]


async def test_the_usage_job_holds_its_singleton_lease(fleet: Fleet) -> None:
    await _book(fleet, "gpu-1", "r-1", at(10), at(11))
    fleet.clock.set(at(11, 10))
    passes = await fleet.compute.jobs.tick()
    assert passes["controllers/usage"] == 1
    assert await _usage(fleet, "t-a") == [(10, "p-1", 3600.0)]


# --- bookings history -------------------------------------------------------------------------------------------


async def _where(fleet: Fleet) -> dict[str, list[str]]:
    """The reservations whose bookings are live, and those moved to history."""
    rows = await fleet.store.fetch(
        fleet.store.sql(
            "SELECT 'live' AS t, reservation_id FROM {s}.bookings"
            " UNION ALL SELECT 'history', reservation_id FROM {s}.bookings_history ORDER BY 1, 2"
        ),
        {},
    )
    found: dict[str, list[str]] = {"live": [], "history": []}
    for row in rows:
        found[row.t].append(row.reservation_id)
    return found


async def _move(fleet: Fleet, *, limit: int = 1000) -> int:
    """One move, checked to be one statement on its own: one checkout, one round trip."""
    usage = fleet.store.pool_usage
    checkouts, trips = usage.checkouts, usage.round_trips
    moved = await fleet.store.repository(BOOKINGS).move_to_history(
        ended_by=fleet.clock.now() - HISTORY_MARGIN, limit=limit
    )
    assert (usage.checkouts - checkouts, usage.round_trips - trips) == (1, 1)
    return moved


async def test_only_bookings_that_ended_before_the_watermark_and_the_margin_move_to_history(fleet: Fleet) -> None:
    await _book(fleet, "gpu-1", "done", at(10), at(11))
    await _book(fleet, "gpu-2", "edge", at(10, 30), at(12))
    await _book(fleet, "gpu-3", "late", at(10), at(12, 30))
    await _book(fleet, "gpu-4", "open", at(10), None)
    await _book(fleet, "gpu-5", "recent", at(13), at(14, 30))
    await _book(fleet, "gpu-6", "future", at(15), at(16), gpus=1 / 7)

    # No accounting pass yet, so no watermark: nothing moves, however long ago a booking ended.
    fleet.clock.set(at(18))
    assert await _move(fleet) == 0

    # Accounted until 12:00: what ended by then moves ("edge" ends exactly then), "late" waits for the watermark.
    fleet.clock.set(at(12, 10))
    await account_usage(fleet.compute.context)
    fleet.clock.set(at(14))
    bookings_of = {r: await fleet.store.repository(BOOKINGS).for_reservation(r) for r in ("done", "edge", "late")}
    assert await _move(fleet) == 2
    assert await _where(fleet) == {"live": ["future", "late", "open", "recent"], "history": ["done", "edge"]}
    assert await _move(fleet) == 0

    # Accounted until 15:00 at 15:10: "recent" ended before the watermark but less than the margin ago.
    fleet.clock.set(at(15, 10))
    await account_usage(fleet.compute.context)
    assert await move_ended_bookings(fleet.compute.context) == 1
    assert await _where(fleet) == {"live": ["future", "open", "recent"], "history": ["done", "edge", "late"]}

    # A reservation's bookings are the same wherever they are.
    for reservation, before in bookings_of.items():
        assert await fleet.store.repository(BOOKINGS).for_reservation(reservation) == before

    # The live bookings still refuse an overlapping one.
    for atom, start, end in (("gpu-4", at(14), at(15)), ("gpu-5", at(14), at(14, 10)), ("gpu-6", at(15, 30), None)):
        with pytest.raises(ConflictError):
            await _book(fleet, atom, "overlap", start, end)


async def test_usage_recomputed_after_a_move_is_what_it_was(fleet: Fleet) -> None:
    await _book(fleet, "gpu-1", "r-1", at(10, 30), at(12, 15))
    await _book(fleet, "mig-1/3", "r-2", at(11), at(13, 40), gpus=1 / 7)
    await _book(fleet, "gpu-2", "r-3", at(11, 45), at(11, 50), tenant="t-b")
    await _book(fleet, "gpu-3", "r-4", at(9), None)
    fleet.clock.set(at(16, 10))
    await account_usage(fleet.compute.context)
    before = {tenant: await _usage(fleet, tenant) for tenant in ("t-a", "t-b")}
    assert before["t-b"] == [(11, "p-1", 300.0)]

    assert await move_ended_bookings(fleet.compute.context) == 3
    assert await _where(fleet) == {"live": ["r-4"], "history": ["r-1", "r-2", "r-3"]}
    # Every hour again, from an earlier watermark (as after a crash): the moved bookings are counted as before.
    await fleet.store.fetch(fleet.store.sql("UPDATE {s}.usage_state SET accounted_until = :at"), {"at": at(8)})
    await account_usage(fleet.compute.context)
    assert {tenant: await _usage(fleet, tenant) for tenant in ("t-a", "t-b")} == before


async def test_a_move_is_bounded_and_moves_each_booking_once(fleet: Fleet) -> None:
    for n in range(5):
        await _book(fleet, f"gpu-{n}", f"r-{n}", at(10), at(10, 10 + n))
    fleet.clock.set(at(12, 10))
    await account_usage(fleet.compute.context)
    assert [await _move(fleet, limit=2) for _ in range(4)] == [2, 2, 1, 0]
    assert await _where(fleet) == {"live": [], "history": [f"r-{n}" for n in range(5)]}
    # Each booking kept its id and its range.
    moved = await fleet.store.repository(BOOKINGS).for_reservation("r-4")
    assert [(b.atom_id, b.start, b.end) for b in moved] == [("gpu-4", at(10), at(10, 14))]


async def test_the_history_job_holds_its_singleton_lease(fleet: Fleet) -> None:
    await _book(fleet, "gpu-1", "r-1", at(10), at(11))
    fleet.clock.set(at(12, 10))
    await account_usage(fleet.compute.context)
    passes = await fleet.compute.jobs.tick()
    assert passes["controllers/bookings-history"] == 1
    assert await _where(fleet) == {"live": [], "history": ["r-1"]}
