"""The MCP server in this process (``mcp.Client(server)``) over a real control plane: the tools are the registry's
methods, an agent reserves a GPU with them, and a credential without the permission is refused and changes nothing."""

from __future__ import annotations

from typing import Any

import attrs
import jsonschema
import mcp
import pytest

from bettercompute_cli._mcp import ComputeMcp, InProcess

from ..iam.conftest import make_user
from .conftest import Fleet, envelope

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def test_every_method_is_a_tool_with_a_valid_schema_and_its_read_only_marking(fleet: Fleet) -> None:
    registry = fleet.t.compute.registry
    async with mcp.Client(ComputeMcp(InProcess(fleet.t.compute), credential=fleet.t.alice)) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    methods = {f"{m.group}_{m.name}": m for m in registry.methods()}
    assert set(tools) == set(methods)
    assert {"reservations_create", "pools_list", "join-tokens_create", "tenants_create"} <= set(tools)
    for name, method in methods.items():
        tool = tools[name]
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint is (not method.mutates), name
        assert tool.description and tool.description.startswith(method.summary), name
        schema = tool.input_schema
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["type"] == "object" and "$ref" not in schema
        # Self-contained: every reference points into the schema's own $defs.
        text = str(schema)
        assert "#/components/" not in text
        assert ("idempotency_key" in schema["properties"]) is method.mutates, name
        # The answer's schema is HTTP's {"data": <output>}; mcp.Client checks every answer below against it.
        assert tool.output_schema is not None and tool.output_schema["required"] == ["data"], name
        jsonschema.Draft202012Validator.check_schema(tool.output_schema)
    assert tools["reservations_cancel"].annotations.destructive_hint is True  # type: ignore[union-attr]
    assert tools["reservations_create"].annotations.destructive_hint is False  # type: ignore[union-attr]
    # The schema is the method's input: what the server would refuse, the schema refuses too.
    create = jsonschema.Draft202012Validator(tools["reservations_create"].input_schema)
    assert create.is_valid({"tenant": "tn_1", "pool_id": "pool_1", "gpus": 1, "duration": "PT1H"})
    assert not create.is_valid({"tenant": "tn_1", "pool_id": "pool_1", "gpus": "one", "duration": "PT1H"})
    assert not create.is_valid({"tenant": "tn_1", "pool_id": "pool_1", "gpus": 1, "duration": "PT1H", "x": 1})


async def test_an_agent_reserves_a_gpu_and_a_viewer_is_refused_without_a_trace(fleet: Fleet, database_url: str) -> None:
    t = fleet.t
    async with mcp.Client(ComputeMcp(InProcess(t.compute), credential=t.alice)) as alice:
        pools = envelope(await alice.call_tool("pools_list", {"tenant": t.acme}))
        (pool,) = [p for p in pools["data"]["pools"] if p["name"] == "gpus"]
        made = envelope(
            await alice.call_tool(
                "reservations_create", {"tenant": t.acme, "pool_id": pool["id"], "gpus": 2, "duration": "PT1H"}
            )
        )["data"]
        assert made["state"] == "placed" and made["gpus"] == 2
        assert [p["node_id"] for p in made["placement"]] == fleet.nodes
        assert len(made["placement"][0]["atoms"]) == 2
        got = envelope(await alice.call_tool("reservations_get", {"id": made["id"]}))
        assert got["data"]["id"] == made["id"]

    async with mcp.Client(ComputeMcp(InProcess(t.compute), credential=fleet.viewer)) as vic:
        seen = envelope(await vic.call_tool("reservations_get", {"id": made["id"]}))  # a viewer reads
        assert seen["data"]["id"] == made["id"]
        refused = await vic.call_tool(
            "reservations_create", {"tenant": t.acme, "pool_id": pool["id"], "gpus": 1, "duration": "PT1H"}
        )
        answer = envelope(refused)
        assert refused.is_error
        assert answer["error"]["code"] == "ACCESS_DENIED"
        assert answer["error"]["details"]["action"] == "compute:reservations:create"
        assert "Traceback" not in str(answer)

    # The allowed reservation left its audit row with its decision; the refused one left no reservation, and an audit
    # row of its own: outcome denied, no decision, the refused caller as the actor.
    audit = fleet.rows(
        database_url,
        "SELECT resource_id, decision_id, outcome, actor FROM {s}.audit WHERE action = %s ORDER BY id",
        "compute:reservations:create",
    )
    assert [(outcome, bool(decision)) for _, decision, outcome, _ in audit] == [("ok", True), ("denied", False)]
    assert audit[0][0] == made["id"] and audit[1][0] != made["id"]
    assert audit[1][3] != audit[0][3]  # the viewer, not alice
    assert fleet.rows(database_url, "SELECT count(*) FROM {s}.reservations") == [(1,)]


async def test_a_member_reserves_extends_and_cancels_but_does_not_manage_pools(fleet: Fleet) -> None:
    t = fleet.t
    holder: Any = attrs.make_class("P", ["compute", "root"])(t.compute, t.root)
    _, member, _ = await make_user(holder, t.acme, "mia", "compute.member")
    async with mcp.Client(ComputeMcp(InProcess(t.compute), credential=member)) as mia:
        body = {"tenant": t.acme, "pool_id": fleet.pool, "gpus": 1, "duration": "PT1H"}
        made = envelope(await mia.call_tool("reservations_create", body))["data"]
        assert made["state"] == "placed"
        longer = envelope(await mia.call_tool("reservations_extend", {"id": made["id"], "duration": "PT2H"}))["data"]
        assert longer["end_at"] > made["end_at"]
        gone = envelope(await mia.call_tool("reservations_cancel", {"id": made["id"]}))["data"]
        assert gone["state"] == "cancelled"
        refused = envelope(await mia.call_tool("pools_create", {"tenant": t.acme, "name": "mine"}))
        assert refused["error"]["code"] == "ACCESS_DENIED"
