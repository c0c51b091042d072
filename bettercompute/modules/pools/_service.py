"""The ``pools`` group's logic.

Pools are projected (``ResourceRef(type="pool", id=..., tenant=..., pool=id)``) in the transaction that creates
them, so decisions on a pool follow its tenant and pool-scoped bindings.
"""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from bettercompute._runtime.registry import CallContext, method
from bettercompute.errors import NotFoundError
from bettercompute.modules._tenants import require_tenant
from bettercompute.modules.pools._port import POOLS, PoolRecord
from bettercompute.modules.pools._schemas import (
    CreatePoolInput,
    GetPoolInput,
    ListPoolsInput,
    ListPoolsOutput,
    NodePolicy,
    Pool,
    UpdatePoolInput,
)
from bettercompute.paging import Keyset
from bettercompute.ports import ResourceRef

POOL = "pool"


def _in_tenant(input: Any) -> ResourceRef:
    # Inputs naming a tenant: the core's pre-check refuses another tenant's caller before the database.
    return ResourceRef(type=POOL, tenant=input.tenant)


def _on_pool(input: Any) -> ResourceRef:
    # The pool's projection row decides its tenant and pool (a pool not projected only passes a root-scope grant).
    return ResourceRef(type=POOL, id=input.id, pool=input.id)


def _pool(record: PoolRecord) -> Pool:
    pool_class: Any = record.pool_class
    return Pool(
        id=record.id,
        tenant=record.tenant,
        name=record.name,
        pool_class=pool_class,
        acceptance_checks=record.acceptance_checks,
        labels=dict(record.labels),
        node_policy=NodePolicy.from_stored(record.node_policy),
        created_at=record.created_at,
        updated_at=record.updated_at,
    )


@method(mutates=True, resource=_in_tenant)
async def create_pool(call: CallContext, input: CreatePoolInput) -> Pool:
    """Create a pool in a tenant.

    Raises:
        NotFoundError: there is no such tenant.
        ConflictError: the tenant has a pool of that name.
    """
    pool_id = f"pool_{secrets.token_hex(8)}"
    async with call.transaction() as tx:
        await require_tenant(tx, input.tenant)
        record = await tx.repository(POOLS).create(
            id=pool_id,
            tenant=input.tenant,
            name=input.name,
            pool_class=input.pool_class,
            acceptance_checks=input.acceptance_checks,
            labels=input.labels,
            node_policy=input.node_policy.stored(),
        )
        await tx.project(ResourceRef(type=POOL, id=pool_id, tenant=input.tenant, pool=pool_id))
        call.describe(
            resource_type=POOL,
            resource_id=pool_id,
            tenant=input.tenant,
            details={"name": input.name, "pool_class": input.pool_class},
        )
    return _pool(record)


# Pools page by (created_at, id), not by name: a rename during a walk would otherwise skip or repeat a pool.
_POOL_PAGES: Keyset[Pool] = Keyset(dt.datetime, str, key=lambda p: (p.created_at, p.id))


@method(mutates=False, resource=_in_tenant)
async def list_pools(call: CallContext, input: ListPoolsInput) -> ListPoolsOutput:
    """A page of a tenant's pools, oldest first.

    Raises:
        InvalidInputError: the cursor is not one this list returned.
    """
    scope = call.method.action
    after = _POOL_PAGES.after(scope, input.cursor)
    records = await call.context.store.repository(POOLS).for_tenant(input.tenant, after=after, limit=input.limit + 1)
    pools, next_cursor = _POOL_PAGES.page(scope, [_pool(r) for r in records], input.limit)
    return ListPoolsOutput(pools=pools, next_cursor=next_cursor)


async def _existing_pool(call: CallContext, pool_id: str) -> PoolRecord:
    record = await call.context.store.repository(POOLS).get(pool_id)
    if record is None:
        raise NotFoundError("no such pool", details={"id": pool_id})
    return record


@method(mutates=False, resource=_on_pool)
async def get_pool(call: CallContext, input: GetPoolInput) -> Pool:
    """A pool by id.

    Raises:
        NotFoundError: there is no such pool.
    """
    return _pool(await _existing_pool(call, input.id))


@method(mutates=True, resource=_on_pool)
async def update_pool(call: CallContext, input: UpdatePoolInput) -> Pool:
    """Rename a pool, or replace its acceptance checks or labels.

    Raises:
        NotFoundError: there is no such pool.
        ConflictError: another pool of the tenant has the new name.
    """
    async with call.transaction() as tx:
        record = await tx.repository(POOLS).update(
            id=input.id,
            name=input.name,
            acceptance_checks=input.acceptance_checks,
            labels=input.labels,
            node_policy=input.node_policy.stored() if input.node_policy is not None else None,
        )
        if record is None:
            raise NotFoundError("no such pool", details={"id": input.id})
        changed = [f for f in ("name", "acceptance_checks", "labels", "node_policy") if getattr(input, f) is not None]
        call.describe(resource_type=POOL, resource_id=input.id, tenant=record.tenant, details={"changed": changed})
    return _pool(record)
