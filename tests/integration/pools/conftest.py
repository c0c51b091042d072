"""A control plane with two tenants, each with an admin, for the ``pools`` and ``join-tokens`` groups."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest

from bettercompute import BetterCompute, JoinSettings
from bettercompute.modules.nodes import JoinTokensGroup
from bettercompute.modules.pools import PoolsGroup
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
    def pools(self) -> PoolsGroup[Any]:
        group: PoolsGroup[Any] = self.compute.api.group(PoolsGroup)
        return group

    @property
    def tokens(self) -> JoinTokensGroup[Any]:
        group: JoinTokensGroup[Any] = self.compute.api.group(JoinTokensGroup)
        return group


@pytest.fixture
async def plane(database_url: str, fresh_schema: str) -> AsyncIterator[Plane]:
    join = JoinSettings(gateway_address="gw.eu-1.example.com:443", trust_domain="example.com")
    async with two_tenants(database_url, fresh_schema, join=join) as t:
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
