"""A whole control plane on real PostgreSQL, with the embedded IAM, per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import httpx
import pytest

from bettercompute import BetterCompute, Options, better_compute
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore


@attrs.frozen(kw_only=True)
class Plane:
    compute: BetterCompute
    iam: EmbeddedIam
    store: PgStore
    root: str
    http: httpx.AsyncClient


@pytest.fixture
async def plane(database_url: str, fresh_schema: str) -> AsyncIterator[Plane]:
    store = PgStore(database_url, schema=fresh_schema, pool_size=4)
    iam = EmbeddedIam()
    compute = better_compute(Options(store=store, iam=iam, instance="test-1"))
    await compute.initialize()
    boot = await iam.bootstrap()
    assert boot.credential is not None
    transport = httpx.ASGITransport(app=compute.asgi)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield Plane(compute=compute, iam=iam, store=store, root=boot.credential, http=http)
    finally:
        await compute.close()
