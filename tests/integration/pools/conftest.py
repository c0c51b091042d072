"""A control plane with two tenants, each with an admin, for the ``pools`` and ``join-tokens`` groups."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest

from bettercompute import BetterCompute, JoinSettings, Options, better_compute
from bettercompute.modules.pools import JoinTokensGroup, PoolsGroup
from bettercompute_iam import CreateTenantInput, EmbeddedIam
from bettercompute_store_pg import PgStore

from ..iam.conftest import make_user


@attrs.frozen(kw_only=True)
class Plane:
    compute: BetterCompute
    store: PgStore
    root: str
    acme: str
    alice: str
    globex: str
    mallory: str
    http: httpx.AsyncClient

    @property
    def pools(self) -> PoolsGroup[Any]:
        group: PoolsGroup[Any] = self.compute.api.group(PoolsGroup)
        return group

    @property
    def tokens(self) -> JoinTokensGroup[Any]:
        group: JoinTokensGroup[Any] = self.compute.api.group(JoinTokensGroup)
        return group


@pytest.fixture
async def plane(database_url: str, fresh_schema: str) -> AsyncIterator[Plane]:
    store = PgStore(database_url, schema=fresh_schema, pool_size=4)
    iam = EmbeddedIam()
    join = JoinSettings(gateway_address="gw.eu-1.example.com:443", trust_domain="example.com")
    compute = better_compute(Options(store=store, iam=iam, instance="test-1", join=join))
    await compute.initialize()
    boot = await iam.bootstrap()
    assert boot.credential is not None
    root = boot.credential
    transport = httpx.ASGITransport(app=compute.asgi)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            acme = (await compute.api.tenants.create(root, CreateTenantInput(name="acme"))).id
            globex = (await compute.api.tenants.create(root, CreateTenantInput(name="globex"))).id
            holder: Any = attrs.make_class("P", ["compute", "root"])(compute, root)
            _, alice, _ = await make_user(holder, acme, "alice", "compute.admin")
            _, mallory, _ = await make_user(holder, globex, "mallory", "compute.admin")
            yield Plane(
                compute=compute,
                store=store,
                root=root,
                acme=acme,
                alice=alice,
                globex=globex,
                mallory=mallory,
                http=http,
            )
    finally:
        await compute.close()
