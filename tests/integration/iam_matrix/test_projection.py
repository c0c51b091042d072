"""Decisions on a resource addressed by id alone follow the authorization projection written by its module."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import pytest

from bettercompute import CallContext, GroupSpec, Job, MethodDef, ModuleContext, Options, better_compute
from bettercompute.errors import AccessDeniedError, NotFoundError
from bettercompute.ports import Migration, ResourceRef
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore

from ._principals import add_principal, add_tenant

pytestmark = [pytest.mark.anyio, pytest.mark.pg]
B = TypeVar("B")


@attrs.frozen(kw_only=True)
class CreateWidget:
    tenant: str
    name: str


@attrs.frozen(kw_only=True)
class GetWidget:
    id: str


@attrs.frozen(kw_only=True)
class FindWidget:
    tenant: str
    id: str


@attrs.frozen(kw_only=True)
class PeekWidget:
    id: str
    pool: str | None = None


@attrs.frozen(kw_only=True)
class Widget:
    id: str
    name: str


NAMES: dict[str, str] = {}


async def create(call: CallContext, input: CreateWidget) -> Widget:
    widget = Widget(id=f"wd_{secrets.token_hex(6)}", name=input.name)
    async with call.transaction() as tx:
        await tx.project(ResourceRef(type="widget", id=widget.id, tenant=input.tenant), owner="someone")
        call.describe(resource_type="widget", resource_id=widget.id, tenant=input.tenant)
    NAMES[widget.id] = widget.name
    return widget


async def get(call: CallContext, input: GetWidget) -> Widget:
    if input.id not in NAMES:
        raise NotFoundError("no such widget", details={"id": input.id})
    return Widget(id=input.id, name=NAMES[input.id])


async def find(call: CallContext, input: FindWidget) -> Widget:
    # Only reached for an id the projection does not contradict: report it missing like get does.
    return await get(call, GetWidget(id=input.id))


async def peek(call: CallContext, input: PeekWidget) -> Widget:
    return Widget(id=input.id, name=NAMES.get(input.id, ""))


class Widgets(GroupSpec[B]):
    name = "widgets"
    create = MethodDef(
        input=CreateWidget,
        output=Widget,
        handler=create,
        mutates=True,
        resource=lambda i: ResourceRef(type="widget", tenant=i.tenant),
    )
    get = MethodDef(
        input=GetWidget,
        output=Widget,
        handler=get,
        mutates=False,
        resource=lambda i: ResourceRef(type="widget", id=i.id),
    )
    # A method whose input names the tenant as well as the id (the pre-check compares that tenant with the caller's).
    find = MethodDef(
        input=FindWidget,
        output=Widget,
        handler=find,
        mutates=False,
        resource=lambda i: ResourceRef(type="widget", id=i.id, tenant=i.tenant),
    )
    # A method that (carelessly) lets the caller name the pool of a resource it addresses by id.
    peek = MethodDef(
        input=PeekWidget,
        output=Widget,
        handler=peek,
        mutates=False,
        resource=lambda i: ResourceRef(type="widget", id=i.id, pool=i.pool),
    )


@attrs.frozen(kw_only=True)
class WidgetModule:
    name: str = "widgets"
    version: str = "1.0.0"
    core_range: str = ">=0.1,<0.2"
    groups: Sequence[type[GroupSpec[Any]]] = (Widgets,)
    actions: Sequence[str] = (
        "compute:widgets:create",
        "compute:widgets:get",
        "compute:widgets:find",
        "compute:widgets:peek",
    )
    migrations: Mapping[str, Sequence[Migration]] = attrs.field(factory=dict)
    jobs: Sequence[Job] = ()

    async def start(self, context: ModuleContext) -> None:
        return None

    async def stop(self) -> None:
        return None


@pytest.fixture
async def api(database_url: str, fresh_schema: str) -> AsyncIterator[Any]:
    compute = better_compute(
        Options(store=PgStore(database_url, schema=fresh_schema), iam=EmbeddedIam(), modules=[WidgetModule()])
    )
    await compute.initialize()
    try:
        yield compute.api
    finally:
        await compute.close()


async def test_the_projection_decides_by_tenant(api: Any, database_url: str, fresh_schema: str) -> None:
    acme = add_tenant(database_url, fresh_schema, "acme")
    evil = add_tenant(database_url, fresh_schema, "evil")
    everything = ["compute:widgets:*"]
    alice = add_principal(database_url, fresh_schema, acme, everything, scope_type="tenant", scope_id=acme)
    mallory = add_principal(database_url, fresh_schema, evil, everything, scope_type="tenant", scope_id=evil)
    # Mallory's grants hold on every tenant's scope, yet the widget's tenant is not hers.
    wide = add_principal(database_url, fresh_schema, evil, everything, scope_type="root")

    # Allowed nothing on widgets: refused, whether the id is acme's or unknown.
    idle = add_principal(database_url, fresh_schema, evil, ["compute:system:*"], scope_type="tenant", scope_id=evil)

    widget = await api.group(Widgets).create(alice, CreateWidget(tenant=acme, name="w1"))
    assert (await api.group(Widgets).get(alice, GetWidget(id=widget.id))).name == "w1"
    # Acme's widget is, to the outsiders, exactly an id that does not exist: the same NOT_FOUND, never the widget.
    for outsider in (mallory, wide):
        with pytest.raises(NotFoundError) as theirs:
            await api.group(Widgets).get(outsider, GetWidget(id=widget.id))
        with pytest.raises(NotFoundError) as unknown:
            await api.group(Widgets).get(outsider, GetWidget(id="wd_unknown"))
        assert (theirs.value.message, theirs.value.details) == ("no such widget", {"id": widget.id})
        assert (unknown.value.message, unknown.value.details) == ("no such widget", {"id": "wd_unknown"})
    for target in (widget.id, "wd_unknown"):
        with pytest.raises(AccessDeniedError):
            await api.group(Widgets).get(idle, GetWidget(id=target))


async def test_an_id_named_with_the_callers_own_tenant_is_not_found_when_it_is_anothers(
    api: Any, database_url: str, fresh_schema: str
) -> None:
    acme = add_tenant(database_url, fresh_schema, "acme")
    evil = add_tenant(database_url, fresh_schema, "evil")
    alice = add_principal(database_url, fresh_schema, acme, ["compute:widgets:*"], scope_type="tenant", scope_id=acme)
    mallory = add_principal(database_url, fresh_schema, evil, ["compute:widgets:*"], scope_type="tenant", scope_id=evil)
    widget = await api.group(Widgets).create(alice, CreateWidget(tenant=acme, name="w"))
    assert (await api.group(Widgets).find(alice, FindWidget(tenant=acme, id=widget.id))).name == "w"
    answers = []
    for target in (widget.id, "wd_unknown"):
        with pytest.raises(NotFoundError) as info:
            await api.group(Widgets).find(mallory, FindWidget(tenant=evil, id=target))
        answers.append((info.value.message, {**info.value.details, "id": "<asked>"}))
    assert answers == [("no such widget", {"id": "<asked>"})] * 2


async def test_a_pool_named_by_the_caller_never_decides(api: Any, database_url: str, fresh_schema: str) -> None:
    acme = add_tenant(database_url, fresh_schema, "acme")
    globex = add_tenant(database_url, fresh_schema, "globex")
    owner = add_principal(database_url, fresh_schema, acme, ["compute:widgets:*"], scope_type="tenant", scope_id=acme)
    # Carol operates pool-a only.
    carol = add_principal(
        database_url, fresh_schema, globex, ["compute:widgets:*"], scope_type="pool", scope_id="pool-a"
    )
    widget = await api.group(Widgets).create(owner, CreateWidget(tenant=acme, name="w"))
    for target in (widget.id, "wd_unprojected"):
        with pytest.raises(AccessDeniedError):
            await api.group(Widgets).peek(carol, PeekWidget(id=target, pool="pool-a"))
