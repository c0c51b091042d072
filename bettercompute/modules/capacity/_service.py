"""The ``quotas`` and ``capacity`` groups' logic.

Every method is decided on its pool (``ResourceRef(type="pool", id=pool_id, pool=pool_id)``, the pool's projection
row giving its tenant), as ``join-tokens`` are: the pool owner's admins set and read its quotas, and a caller of
another tenant gets the answers it would get for any pool it cannot see.

Admission (``reservations.create``, in the store's admission function) enforces the quota these methods set.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

from bettercompute._runtime.registry import CallContext, method
from bettercompute.errors import NotFoundError
from bettercompute.modules._tenants import require_tenant
from bettercompute.modules.capacity._port import CAPACITY, QUOTAS, AtomCount, BookedHours, QuotaRecord
from bettercompute.modules.capacity._schemas import (
    Capacity,
    CapacityDay,
    EffectiveQuota,
    GetCapacityInput,
    GetQuotaInput,
    ListQuotasInput,
    ListQuotasOutput,
    ModelCapacity,
    Quota,
    SetQuotaInput,
)
from bettercompute.modules.pools import POOLS, PoolRecord
from bettercompute.paging import Keyset
from bettercompute.ports import ResourceRef

POOL = "pool"
QUOTA = "quota"
UNKNOWN = "unknown"
"""The model or reason reported for atoms whose node did not give one."""


def _on_pool(input: Any) -> ResourceRef:
    # The pool's projection row decides its tenant and pool (a pool not projected only passes a root-scope grant).
    return ResourceRef(type=POOL, id=input.pool_id, pool=input.pool_id)


def _quota(record: QuotaRecord) -> Quota:
    return Quota(
        pool_id=record.pool_id,
        tenant=record.tenant,
        max_gpus=record.max_gpus,
        max_gpu_hours_per_month=record.max_gpu_hours_per_month,
        max_reservation_hours=record.max_reservation_hours,
        updated_at=record.updated_at,
    )


async def _existing_pool(call: CallContext, pool_id: str) -> PoolRecord:
    record = await call.context.store.repository(POOLS).get(pool_id)
    if record is None:
        raise NotFoundError("no such pool", details={"id": pool_id})
    return record


# --- quotas -----------------------------------------------------------------------------------------------------


@method(mutates=True, resource=_on_pool)
async def set_quota(call: CallContext, input: SetQuotaInput) -> Quota:
    """Set a pool's quota for a tenant, or its default (``tenant`` null), replacing both limits of that row.

    Raises:
        NotFoundError: there is no such pool, or no such tenant.
    """
    pool = await _existing_pool(call, input.pool_id)
    async with call.transaction() as tx:
        if input.tenant is not None:
            await require_tenant(tx, input.tenant)
        record = await tx.repository(QUOTAS).put(
            pool_id=pool.id,
            tenant=input.tenant,
            max_gpus=input.max_gpus,
            max_gpu_hours_per_month=input.max_gpu_hours_per_month,
            max_reservation_hours=input.max_reservation_hours,
        )
        call.describe(
            resource_type=QUOTA,
            resource_id=f"{pool.id}/{input.tenant or '*'}",
            tenant=pool.tenant,
            details={
                "pool_id": pool.id,
                "tenant": input.tenant,
                "max_gpus": input.max_gpus,
                "max_gpu_hours_per_month": input.max_gpu_hours_per_month,
                "max_reservation_hours": input.max_reservation_hours,
            },
        )
    return _quota(record)


@method(mutates=False, resource=_on_pool)
async def get_quota(call: CallContext, input: GetQuotaInput) -> EffectiveQuota:
    """The quota that applies to a tenant in a pool: its own row, else the pool's default, else unlimited.

    Raises:
        NotFoundError: there is no such pool.
    """
    await _existing_pool(call, input.pool_id)
    record = await call.context.store.repository(QUOTAS).effective(input.pool_id, input.tenant)
    if record is None:
        return EffectiveQuota(
            pool_id=input.pool_id,
            tenant=input.tenant,
            max_gpus=None,
            max_gpu_hours_per_month=None,
            max_reservation_hours=None,
            source="unlimited",
        )
    return EffectiveQuota(
        pool_id=input.pool_id,
        tenant=input.tenant,
        max_gpus=record.max_gpus,
        max_gpu_hours_per_month=record.max_gpu_hours_per_month,
        max_reservation_hours=record.max_reservation_hours,
        source="tenant" if record.tenant is not None else "pool_default",
    )


# The default row sorts first (its key is the empty tenant, which no tenant id is).
_QUOTA_PAGES: Keyset[Quota] = Keyset(str, key=lambda q: (q.tenant or "",))


@method(mutates=False, resource=_on_pool)
async def list_quotas(call: CallContext, input: ListQuotasInput) -> ListQuotasOutput:
    """A page of a pool's quota rows: its default first (if set), then per tenant by tenant id.

    Raises:
        NotFoundError: there is no such pool.
        InvalidInputError: the cursor is not one this list returned.
    """
    scope = call.method.action
    after = _QUOTA_PAGES.after(scope, input.cursor)
    await _existing_pool(call, input.pool_id)
    records = await call.context.store.repository(QUOTAS).for_pool(input.pool_id, after=after, limit=input.limit + 1)
    quotas, next_cursor = _QUOTA_PAGES.page(scope, [_quota(r) for r in records], input.limit)
    return ListQuotasOutput(quotas=quotas, next_cursor=next_cursor)


# --- capacity ---------------------------------------------------------------------------------------------------


_LATEST = dt.datetime.max.replace(tzinfo=dt.UTC)
"""Where a window starting in the year 9999 ends (Python's datetimes end there)."""


def _window(input: GetCapacityInput, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    start = input.start if input.start is not None else now
    try:
        end = start + dt.timedelta(days=input.days)
    except OverflowError:
        end = _LATEST
    return start, end


def _days(start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """The UTC days the window touches, by their midnight."""
    day = dt.datetime.combine(start.astimezone(dt.UTC).date(), dt.time(), dt.UTC)
    out = [day]
    while end - day > dt.timedelta(days=1):
        day += dt.timedelta(days=1)
        out.append(day)
    return out


def _capacity(
    pool_id: str,
    at: dt.datetime,
    start: dt.datetime,
    end: dt.datetime,
    counts: list[AtomCount],
    hours: list[BookedHours],
) -> Capacity:
    models: dict[str, dict[str, Any]] = {}

    def model_of(name: str | None) -> dict[str, Any]:
        key = name or UNKNOWN
        return models.setdefault(
            key,
            {"atoms": 0, "available": 0, "free": 0, "booked": 0, "booked_gpus": 0.0, "unavailable": {}, "hours": 0.0},
        )

    for c in counts:
        m = model_of(c.model)
        m["atoms"] += c.atoms
        m["booked"] += c.booked
        m["booked_gpus"] += c.booked_gpus
        if c.state == "available":
            m["available"] += c.atoms
            m["free"] += c.atoms - c.booked
        else:
            reason = c.reason or UNKNOWN
            m["unavailable"][reason] = m["unavailable"].get(reason, 0) + c.atoms
    per_day: dict[dt.datetime, dict[str, float]] = defaultdict(dict)
    for h in hours:
        key = h.model or UNKNOWN
        model_of(h.model)["hours"] += h.gpu_hours
        per_day[h.day][key] = per_day[h.day].get(key, 0.0) + h.gpu_hours
    days = tuple(
        CapacityDay(day=d, gpu_hours=sum(per_day[d].values()), by_model=dict(sorted(per_day[d].items())))
        for d in _days(start, end)
    )
    unavailable: dict[str, int] = {}
    for m in models.values():
        for reason, n in m["unavailable"].items():
            unavailable[reason] = unavailable.get(reason, 0) + n
    return Capacity(
        pool_id=pool_id,
        at=at,
        start=start,
        end=end,
        atoms=sum(m["atoms"] for m in models.values()),
        available=sum(m["available"] for m in models.values()),
        free=sum(m["free"] for m in models.values()),
        booked=sum(m["booked"] for m in models.values()),
        booked_gpus=sum(m["booked_gpus"] for m in models.values()),
        unavailable=dict(sorted(unavailable.items())),
        gpu_hours=sum(d.gpu_hours for d in days),
        days=days,
        models=tuple(
            ModelCapacity(
                model=name,
                atoms=m["atoms"],
                available=m["available"],
                free=m["free"],
                booked=m["booked"],
                booked_gpus=m["booked_gpus"],
                unavailable=dict(sorted(m["unavailable"].items())),
                gpu_hours=m["hours"],
            )
            for name, m in sorted(models.items())
        ),
    )


@method(mutates=False, resource=_on_pool)
async def get_capacity(call: CallContext, input: GetCapacityInput) -> Capacity:
    """A pool's atoms now (total, available, free, booked, unavailable by reason) and the GPU-hours booked over a
    window, per UTC day and per GPU model, read in two statements.

    Atoms exist only where node identity is on (``Options.join`` with ``Options.kms``: the inventory module makes
    them, and only its nodes are booked); elsewhere a pool can hold no node, so the answer is zeros, without a query.

    Raises:
        NotFoundError: there is no such pool.
    """
    now = call.context.clock.now()
    start, end = _window(input, now)
    await _existing_pool(call, input.pool_id)
    counts: list[AtomCount] = []
    hours: list[BookedHours] = []
    if "inventory" in dict(call.context.module_versions):
        reads = call.context.store.repository(CAPACITY)
        counts = await reads.atoms(input.pool_id, at=now)
        hours = await reads.booked_hours(input.pool_id, start=start, end=end)
    return _capacity(input.pool_id, now, start, end, counts, hours)
