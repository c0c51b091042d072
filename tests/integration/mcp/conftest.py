"""A control plane with a GPU pool to reserve from: tenants acme (alice, its admin, and vic, a viewer) and globex,
one node of 8 GPUs seeded into acme's pool ``gpus`` as the inventory controller leaves an adopted node."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import mcp_types
import psycopg
import pytest

from bettercompute import JoinSettings, LocalKeyKms
from bettercompute.modules.pools import CreatePoolInput, Pool, PoolsGroup

from ..capacity.conftest import seed_fleet
from ..cli.conftest import start_cli as start_cli  # the fixture, for the tests of the --http command
from ..iam.conftest import TwoTenants, make_user, two_tenants


@attrs.frozen(kw_only=True)
class Fleet:
    t: TwoTenants
    pool: str
    nodes: list[str]
    viewer: str
    """A credential of acme's viewer: it may read, not reserve."""

    def rows(self, database_url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` on the plane's schema (``{s}`` names it)."""
        with psycopg.connect(database_url) as conn:
            return conn.execute(sql.replace("{s}", f'"{self.t.store.schema}"'), args).fetchall()


@pytest.fixture
async def fleet(database_url: str, fresh_schema: str, tmp_path: Path) -> AsyncIterator[Fleet]:
    join = JoinSettings(gateway_address="gw.mcp.example:443", trust_domain="mcp.example")
    async with two_tenants(database_url, fresh_schema, join=join, kms=LocalKeyKms(tmp_path / "kms.key")) as t:
        pools: PoolsGroup[Any] = t.compute.api.group(PoolsGroup)
        pool: Pool = await pools.create(t.alice, CreatePoolInput(tenant=t.acme, name="gpus"))
        nodes = seed_fleet(database_url, fresh_schema, tenant=t.acme, pool=pool.id, nodes=1, prefix="mcpnode")
        holder: Any = attrs.make_class("P", ["compute", "root"])(t.compute, t.root)
        _, viewer, _ = await make_user(holder, t.acme, "vic", "compute.viewer")
        yield Fleet(t=t, pool=pool.id, nodes=nodes, viewer=viewer)


def envelope(result: mcp_types.CallToolResult) -> dict[str, Any]:
    """What a tool answered, as the agent reads it: the JSON in its one text block."""
    assert len(result.content) == 1 and isinstance(result.content[0], mcp_types.TextContent), result.content
    answer: dict[str, Any] = json.loads(result.content[0].text)
    assert answer == result.structured_content
    assert result.is_error == ("error" in answer), answer
    return answer
