"""Control planes with two tenants for the ``quotas`` and ``capacity`` groups: one with node identity (atoms exist)
and one without, both on a manual clock."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest

from bettercompute import JoinSettings, LocalKeyKms
from bettercompute.modules.capacity import CapacityGroup, QuotasGroup
from bettercompute.modules.pools import CreatePoolInput, Pool, PoolsGroup
from bettercompute.modules.reservations import ReservationsGroup
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


def reservations(plane: Plane) -> ReservationsGroup[Any]:
    """The plane's ``reservations`` group, typed."""
    group: ReservationsGroup[Any] = plane.t.compute.api.group(ReservationsGroup)
    return group


def rows(plane: Plane, database_url: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` run on the plane's schema (``{s}`` names it), over a connection of its own."""
    with psycopg.connect(database_url) as conn:
        return conn.execute(sql.replace("{s}", f'"{plane.t.store.schema}"')).fetchall()


@pytest.fixture
async def plane(database_url: str, fresh_schema: str, tmp_path: Path) -> AsyncIterator[Plane]:
    clock = ManualClock(NOW)
    join = JoinSettings(gateway_address="gw.capacity.example:443", trust_domain="capacity.example")
    # The bursts here are about placement, not load shedding: a queue that holds any of them waits rather than sheds.
    async with two_tenants(
        database_url, fresh_schema, join=join, kms=LocalKeyKms(tmp_path / "kms.key"), clock=clock, max_queued=1024
    ) as t:
        yield Plane(t=t, clock=clock)


@pytest.fixture
async def bare_plane(database_url: str, fresh_schema: str) -> AsyncIterator[Plane]:
    """Without ``Options.join`` and ``Options.kms``: no node identity, so no atoms table."""
    clock = ManualClock(NOW)
    async with two_tenants(database_url, fresh_schema, clock=clock) as t:
        yield Plane(t=t, clock=clock)


H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"


def seed_fleet(
    database_url: str,
    schema: str,
    *,
    tenant: str,
    pool: str,
    nodes: int,
    gpus: int = 8,
    model: str = H100,
    memory_mib: int = 81920,
    prefix: str = "n",
    nvlink: str = "all",
    state: str = "adopted",
) -> list[str]:
    """Insert ``nodes`` adopted nodes (projected, as JoinService projects them) of ``gpus`` available GPU atoms each,
    as the inventory controller would leave them, in a few statements however many there are; their ids.
    ``nvlink``: ``all`` (every GPU a peer of every other on its node), ``pairs`` (GPUs 0-1, 2-3, ... are peers)
    or ``none``."""
    s = f'"{schema}"'
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {s}.nodes (id, tenant, pool_id, state, hardware_key)"
            f" SELECT %(p)s || i, %(t)s, %(pool)s, %(state)s, 'hw-' || %(p)s || i FROM generate_series(0, %(n)s - 1) i",
            {"p": prefix, "t": tenant, "pool": pool, "state": state, "n": nodes},
        )
        conn.execute(
            f"INSERT INTO {s}.authz_resources (resource_type, resource_id, tenant_id, pool_id)"
            f" SELECT 'node', %(p)s || i, %(t)s, %(pool)s FROM generate_series(0, %(n)s - 1) i",
            {"p": prefix, "t": tenant, "pool": pool, "n": nodes},
        )
        peers = {
            "all": "(SELECT jsonb_agg('GPU-' || %(p)s || i || '-' || k)"
            " FROM generate_series(0, %(g)s - 1) k WHERE k <> j)",
            "pairs": "jsonb_build_array('GPU-' || %(p)s || i || '-' || (j # 1))",
            "none": "'[]'::jsonb",
        }[nvlink]
        conn.execute(
            f"INSERT INTO {s}.devices (id, node_id, tenant, pool_id, kind, ident, state, model, details)"
            f" SELECT 'dev-' || %(p)s || i || '-' || j, %(p)s || i, %(t)s, %(pool)s, 'gpu',"
            f" 'GPU-' || %(p)s || i || '-' || j, 'present', %(model)s,"
            f" jsonb_build_object('memory_mib', %(mem)s, 'nvlink_peers', {peers})"
            f" FROM generate_series(0, %(n)s - 1) i, generate_series(0, %(g)s - 1) j",
            {"p": prefix, "t": tenant, "pool": pool, "n": nodes, "g": gpus, "model": model, "mem": memory_mib},
        )
        conn.execute(
            f"INSERT INTO {s}.atoms (id, node_id, device_id, tenant, pool_id, kind, ident, model, memory_mib, state)"
            f" SELECT 'atom-' || %(p)s || i || '-' || j, %(p)s || i, 'dev-' || %(p)s || i || '-' || j, %(t)s,"
            f" %(pool)s, 'gpu', 'GPU-' || %(p)s || i || '-' || j, %(model)s, %(mem)s, 'available'"
            f" FROM generate_series(0, %(n)s - 1) i, generate_series(0, %(g)s - 1) j",
            {"p": prefix, "t": tenant, "pool": pool, "n": nodes, "g": gpus, "model": model, "mem": memory_mib},
        )
    return [f"{prefix}{i}" for i in range(nodes)]
