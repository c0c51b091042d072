"""A control plane with two tenants, each with an admin, for the ``images`` group."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest

from bettercompute import ApiBinding, BetterCompute
from bettercompute.modules.images import ImagesGroup
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

    @property
    def images(self) -> ImagesGroup[ApiBinding]:
        return self.compute.api.images

    async def post(self, path: str, body: Any, *, credential: str | None = None, **headers: str) -> httpx.Response:
        auth = {"authorization": f"Bearer {credential or self.alice}", **headers}
        return await self.http.post(f"/api/compute/{path}", headers=auth, json=body)

    async def post_raw(self, path: str, content: bytes) -> httpx.Response:
        headers = {"authorization": f"Bearer {self.alice}", "content-type": "application/json"}
        return await self.http.post(f"/api/compute/{path}", headers=headers, content=content)

    async def count(self, table: str) -> int:
        rows = await self.store.fetch(self.store.sql(f"SELECT count(*) AS n FROM {{s}}.{table}"), {})
        return int(rows[0].n)


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
        )
