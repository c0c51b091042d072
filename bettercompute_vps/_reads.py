"""The ``instances`` methods that only read: get, list, console, usage."""

from __future__ import annotations

import datetime as dt

from bettercompute import CallContext, method
from bettercompute.errors import InvalidInputError, NotFoundError
from bettercompute.paging import Keyset
from bettercompute_vps._lifecycle import in_tenant, on_instance
from bettercompute_vps._port import VPS, InstanceRecord
from bettercompute_vps._schemas import (
    Console,
    Instance,
    InstanceInput,
    ListInstancesInput,
    ListInstancesOutput,
    PoolUsage,
    Usage,
    UsageInput,
)
from bettercompute_vps._views import instance_view

__all__ = ["console", "existing", "get", "list_instances", "usage"]

MAX_USAGE_WINDOW = dt.timedelta(days=366)

_PAGES: Keyset[Instance] = Keyset(dt.datetime, str, key=lambda i: (i.created_at, i.id))


async def existing(call: CallContext, instance_id: str) -> InstanceRecord:
    """The instance, or ``NotFoundError``."""
    record = await call.context.store.repository(VPS).get_instance(instance_id)
    if record is None:
        raise NotFoundError("no such instance", details={"id": instance_id})
    return record


@method(mutates=False, resource=on_instance)
async def get(call: CallContext, input: InstanceInput) -> Instance:
    """An instance: its state, current step and reason, where it runs and its addresses."""
    return instance_view(await existing(call, input.id))


@method(mutates=False, resource=in_tenant)
async def list_instances(call: CallContext, input: ListInstancesInput) -> ListInstancesOutput:
    """A page of a tenant's instances (optionally one pool's), oldest first; deleted ones only when asked."""
    scope = call.method.action
    after = _PAGES.after(scope, input.cursor)
    records = await call.context.store.repository(VPS).list_instances(
        input.tenant,
        pool_id=input.pool_id,
        include_deleted=input.include_deleted,
        after=after,
        limit=input.limit + 1,
    )
    instances, next_cursor = _PAGES.page(scope, [instance_view(r) for r in records], input.limit)
    return ListInstancesOutput(instances=instances, next_cursor=next_cursor)


@method(mutates=False, resource=on_instance)
async def console(call: CallContext, input: InstanceInput) -> Console:
    """The tail of an instance's serial console (hosted pools; a provider pool's instances have none here)."""
    record = await existing(call, input.id)
    return Console(id=record.id, text=record.console, updated_at=record.console_at)


@method(mutates=False, resource=in_tenant)
async def usage(call: CallContext, input: UsageInput) -> Usage:
    """What the tenant's instances held per pool over ``[start, end)``: vCPU-, memory-GiB-, disk-GiB- and
    GPU-hours, from the instances' bookings (a resize closes one booking and opens the next).

    Raises:
        InvalidInputError: ``end`` is not after ``start``, or the window is longer than 366 days.
    """
    if input.end <= input.start:
        raise InvalidInputError("end: must be after start", details={"path": "end"})
    if input.end - input.start > MAX_USAGE_WINDOW:
        raise InvalidInputError("end: the window is at most 366 days", details={"path": "end"})
    rows = await call.context.store.repository(VPS).usage(
        input.tenant, pool_id=input.pool_id, start=input.start, end=input.end
    )
    return Usage(
        tenant=input.tenant,
        start=input.start,
        end=input.end,
        pools=tuple(PoolUsage(**r) for r in rows),
    )
