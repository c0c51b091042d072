"""Control planes with two tenants for the ``quotas`` and ``capacity`` groups: one with node identity (atoms exist)
and one without, both on a manual clock."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from bettercompute import JoinSettings, LocalKeyKms
from bettercompute.modules.capacity import CapacityGroup, QuotasGroup
from bettercompute.modules.pools import CreatePoolInput, Pool, PoolsGroup
from bettercompute.testing import ManualClock

from ..iam.conftest import TwoTenants, two_tenants

NOW = dt.datetime(2026, 3, 10, 12, 0, tzinfo=dt.UTC)


@attrs.frozen(kw_only=True)
class Plane:
    t: TwoTenants
    clock: ManualClock

    @property
    def quotas(self) -> QuotasGroup[Any]:
        group: QuotasGroup[Any] = self.t.compute.api.group(QuotasGroup)
        return group

    @property
    def capacity(self) -> CapacityGroup[Any]:
        group: CapacityGroup[Any] = self.t.compute.api.group(CapacityGroup)
        return group

    async def pool(self, name: str = "gpus") -> str:
        pools: PoolsGroup[Any] = self.t.compute.api.group(PoolsGroup)
        pool: Pool = await pools.create(self.t.alice, CreatePoolInput(tenant=self.t.acme, name=name))
        return pool.id


@pytest.fixture
async def plane(database_url: str, fresh_schema: str, tmp_path: Path) -> AsyncIterator[Plane]:
    clock = ManualClock(NOW)
    join = JoinSettings(gateway_address="gw.capacity.example:443", trust_domain="capacity.example")
    async with two_tenants(
        database_url, fresh_schema, join=join, kms=LocalKeyKms(tmp_path / "kms.key"), clock=clock
    ) as t:
        yield Plane(t=t, clock=clock)


@pytest.fixture
async def bare_plane(database_url: str, fresh_schema: str) -> AsyncIterator[Plane]:
    """Without ``Options.join`` and ``Options.kms``: no node identity, so no atoms table."""
    clock = ManualClock(NOW)
    async with two_tenants(database_url, fresh_schema, clock=clock) as t:
        yield Plane(t=t, clock=clock)
