"""A control plane with two tenants, each with an admin, for the ``audit`` group."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest

from bettercompute import ApiBinding, BetterCompute
from bettercompute.modules.audit import AuditGroup
from bettercompute_store_pg import PgStore

from ..iam.conftest import two_tenants


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
    url: str
    schema: str

    @property
    def audit(self) -> AuditGroup[ApiBinding]:
        return self.compute.api.audit

    async def post(self, path: str, body: Any, *, credential: str | None = None) -> httpx.Response:
        auth = {"authorization": f"Bearer {credential or self.alice}"}
        return await self.http.post(f"/api/compute/{path}", headers=auth, json=body)

    async def sql(self, statement: str) -> list[Any]:
        return await self.store.fetch(self.store.sql(statement), {})


@pytest.fixture
async def plane(database_url: str, fresh_schema: str) -> AsyncIterator[Plane]:
    async with two_tenants(database_url, fresh_schema) as t:
        yield Plane(
            compute=t.compute,
            store=t.store,
            root=t.root,
            acme=t.acme,
            alice=t.alice,
            globex=t.globex,
            mallory=t.mallory,
            http=t.http,
            url=database_url,
            schema=fresh_schema,
        )
