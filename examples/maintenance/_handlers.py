"""The ``maintenance`` group's methods, each declared once with ``@method``."""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from bettercompute import CallContext, method
from bettercompute.errors import InvalidInputError, NotFoundError
from bettercompute.modules.pools import POOLS
from bettercompute.paging import Keyset
from bettercompute.ports import ResourceRef
from examples.maintenance._port import MAINTENANCE, WindowRecord
from examples.maintenance._schemas import CreateWindowInput, ListWindowsInput, ListWindowsOutput, Window

__all__ = ["create", "list_windows"]

WINDOW = "maintenance-window"
_PAGES: Keyset[Window] = Keyset(dt.datetime, str, key=lambda w: (w.starts_at, w.id))


def _in_tenant(input: Any) -> ResourceRef:
    # The input names its tenant: the core refuses another tenant's caller before any database access.
    return ResourceRef(type=WINDOW, tenant=input.tenant)


def _window(record: WindowRecord) -> Window:
    return Window(
        id=record.id,
        tenant=record.tenant,
        pool_id=record.pool_id,
        starts_at=record.starts_at,
        ends_at=record.ends_at,
        reason=record.reason,
    )


@method(mutates=True, resource=_in_tenant)
async def create(call: CallContext, input: CreateWindowInput) -> Window:
    """Plan a maintenance window for one of the tenant's pools.

    Raises:
        InvalidInputError: the window ends before it starts.
        NotFoundError: the tenant has no such pool.
    """
    if input.ends_at <= input.starts_at:
        raise InvalidInputError("ends_at: must be after starts_at", details={"path": "ends_at"})
    pool = await call.context.store.repository(POOLS).get(input.pool_id)
    if pool is None or pool.tenant != input.tenant:
        raise NotFoundError("no such pool in this tenant", details={"id": input.pool_id})
    record = WindowRecord(
        id=f"mw_{secrets.token_hex(8)}",
        tenant=input.tenant,
        pool_id=input.pool_id,
        starts_at=input.starts_at.astimezone(dt.UTC),
        ends_at=input.ends_at.astimezone(dt.UTC),
        reason=input.reason,
    )
    async with call.transaction() as tx:
        await tx.repository(MAINTENANCE).create(record)
        await tx.project(ResourceRef(type=WINDOW, id=record.id, tenant=record.tenant, pool=record.pool_id))
        call.describe(resource_id=record.id, details={"pool_id": record.pool_id})
    return _window(record)


@method(mutates=False, resource=_in_tenant)
async def list_windows(call: CallContext, input: ListWindowsInput) -> ListWindowsOutput:
    """A page of the tenant's maintenance windows, earliest first."""
    scope = call.method.action
    after = _PAGES.after(scope, input.cursor)
    records = await call.context.store.repository(MAINTENANCE).for_tenant(
        input.tenant, after=after, limit=input.limit + 1
    )
    page, next_cursor = _PAGES.page(scope, [_window(r) for r in records], input.limit)
    return ListWindowsOutput(windows=page, next_cursor=next_cursor)
