"""The example third-party module (``examples/maintenance``) composed into a real control plane: its migrations run
under its own name, its methods are typed through its own group set, audited, idempotent and authorized like the
core's."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bettercompute import ApiBinding, Options, better_compute
from bettercompute.errors import AccessDeniedError, InvalidInputError, NotFoundError
from bettercompute.modules.pools import CreatePoolInput
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore
from examples.maintenance import (
    CreateWindowInput,
    ListWindowsInput,
    MaintenanceGroups,
    MaintenanceModule,
    Window,
)

from ..iam.conftest import TwoTenants, make_user, two_tenants

pytestmark = pytest.mark.anyio

START = dt.datetime(2027, 1, 4, 22, 0, tzinfo=dt.UTC)


@pytest.fixture
async def plane(database_url: str, fresh_schema: str) -> AsyncIterator[TwoTenants]:
    async with two_tenants(database_url, fresh_schema, modules=[MaintenanceModule()]) as t:
        yield t


def _window(t: TwoTenants, pool: str, hours: int = 2) -> CreateWindowInput:
    return CreateWindowInput(
        tenant=t.acme, pool_id=pool, starts_at=START, ends_at=START + dt.timedelta(hours=hours), reason="firmware"
    )


async def test_the_module_plans_and_lists_windows(plane: TwoTenants) -> None:
    t = plane
    groups: MaintenanceGroups[ApiBinding] = MaintenanceGroups(t.compute.api)
    pool = await t.compute.api.pools.create(t.alice, CreatePoolInput(tenant=t.acme, name="gpus"))
    made = await groups.maintenance.create(t.alice, _window(t, pool.id), idempotency_key="fw-1")
    again = await groups.maintenance.create(t.alice, _window(t, pool.id), idempotency_key="fw-1")
    assert isinstance(made, Window) and again == made
    listed = await groups.maintenance.list(t.alice, ListWindowsInput(tenant=t.acme))
    assert listed.windows == (made,) and listed.next_cursor is None

    recorded = await t.store.fetch(
        t.store.sql("SELECT version, name FROM {s}.schema_migrations WHERE module = 'maintenance'"), {}
    )
    assert [(r.version, r.name) for r in recorded] == [(1, "maintenance windows")]
    audit = await t.store.fetch(
        t.store.sql("SELECT resource_id, decision_id FROM {s}.audit WHERE action = 'compute:maintenance:create'"), {}
    )
    assert [r.resource_id for r in audit] == [made.id] and audit[0].decision_id


async def test_bad_input_and_other_tenants_are_refused(plane: TwoTenants) -> None:
    t = plane
    groups = MaintenanceGroups(t.compute.api)
    pool = await t.compute.api.pools.create(t.alice, CreatePoolInput(tenant=t.acme, name="gpus"))
    with pytest.raises(InvalidInputError):
        await groups.maintenance.create(t.alice, _window(t, pool.id, hours=-1))
    naive = {"tenant": t.acme, "pool_id": pool.id, "starts_at": "2027-01-04T22:00:00", "ends_at": "2027-01-05T00:00:00"}
    response = await t.http.post(
        "/api/compute/maintenance/create",
        headers={"authorization": f"Bearer {t.alice}"},
        json={**naive, "reason": "firmware"},
    )
    assert response.status_code == 400 and response.json()["error"]["details"]["path"] == "starts_at"
    with pytest.raises(NotFoundError):
        await groups.maintenance.create(t.alice, _window(t, "pool_missing"))
    with pytest.raises(AccessDeniedError):  # another tenant's caller
        await groups.maintenance.create(t.mallory, _window(t, pool.id))
    holder: Any = t  # make_user reads only .compute and .root
    _, viewer, _ = await make_user(holder, t.acme, "vic", "compute.viewer")
    assert (await groups.maintenance.list(viewer, ListWindowsInput(tenant=t.acme))).windows == ()
    with pytest.raises(AccessDeniedError):  # a viewer reads, and only reads
        await groups.maintenance.create(viewer, _window(t, pool.id))


async def test_a_process_without_the_module_does_not_take_its_reads_from_the_viewer(
    plane: TwoTenants, database_url: str
) -> None:
    t = plane
    other = better_compute(
        Options(store=PgStore(database_url, schema=t.store.schema, pool_size=2), iam=EmbeddedIam(), instance="b")
    )
    await other.initialize()  # upserts the built-in roles from a registry without the maintenance group
    await other.close()
    holder: Any = t
    _, viewer, _ = await make_user(holder, t.acme, "vera", "compute.viewer")
    listed = await MaintenanceGroups(t.compute.api).maintenance.list(viewer, ListWindowsInput(tenant=t.acme))
    assert listed.windows == ()
