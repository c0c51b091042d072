"""The example agent (``examples/mcp_agent``): it starts ``better-compute mcp`` over stdio against a served control
plane and reserves a GPU of a pool it finds by name; a viewer's agent is refused, and a pool that is not there is
``NOT_FOUND``."""

from __future__ import annotations

import pytest

from examples.mcp_agent import AgentError, reserve_gpu

from ..cli.conftest import command
from ..mcp.conftest import Fleet
from ..mcp.conftest import fleet as fleet  # the fixture
from ._serve import serving

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def test_the_example_agent_reserves_a_gpu_over_stdio(fleet: Fleet, database_url: str) -> None:
    t = fleet.t
    async with serving(t.compute.asgi, lifespan="off") as base:
        done = await reserve_gpu("gpus", gpus=2, server=base, token=t.alice, command=command())
        assert "reservations_create" in done.tools and "pools_list" in done.read_only
        assert "reservations_create" not in done.read_only
        assert done.pool_id == fleet.pool
        assert done.reservation["state"] == "placed" and done.reservation["gpus"] == 2
        assert done.reservation["placement"][0]["node_id"] == fleet.nodes[0]
        with pytest.raises(AgentError) as refused:
            await reserve_gpu("gpus", server=base, token=fleet.viewer, command=command())
        assert refused.value.code == "ACCESS_DENIED" and refused.value.tool == "reservations_create"
        with pytest.raises(AgentError) as missing:
            await reserve_gpu("tpus", server=base, token=t.alice, command=command())
        assert missing.value.code == "NOT_FOUND"
    assert fleet.rows(database_url, "SELECT count(*) FROM {s}.reservations") == [(1,)]
