"""The agent: an MCP client over stdio that reserves GPUs of a pool found by name."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from typing import Any

import attrs
import mcp
import mcp_types
from mcp.client.stdio import StdioServerParameters


class AgentError(Exception):
    """A tool answered an error: its ``code`` (``ACCESS_DENIED``, ``NO_CAPACITY``, ...) and ``message``."""

    def __init__(self, tool: str, code: str, message: str) -> None:
        super().__init__(f"{tool}: {code}: {message}")
        self.tool = tool
        self.code = code


@attrs.frozen(kw_only=True)
class Reserved:
    """What the agent saw and did."""

    tools: list[str]
    read_only: list[str]
    pool_id: str
    reservation: dict[str, Any]


def _data(tool: str, result: mcp_types.CallToolResult) -> Any:
    """A tool's answer: its ``data``, or ``AgentError`` with the envelope's code."""
    block = result.content[0]
    answer = json.loads(block.text) if isinstance(block, mcp_types.TextContent) else {}
    if result.is_error:
        error = answer.get("error", {})
        raise AgentError(tool, str(error.get("code", "UNKNOWN")), str(error.get("message", "")))
    return answer["data"]


async def reserve_gpu(
    pool_name: str,
    *,
    gpus: int = 1,
    duration: str = "PT1H",
    server: str | None = None,
    token: str | None = None,
    command: Sequence[str] = ("better-compute",),
) -> Reserved:
    """Start ``command mcp`` (the server at ``server``, else ``BETTERCOMPUTE_URL``; the credential ``token``, else
    ``BETTERCOMPUTE_TOKEN`` or ``TOKEN``), then reserve ``gpus`` GPUs of the pool named ``pool_name``.

    Raises:
        AgentError: a tool answered an error, or no pool has that name (``NOT_FOUND``).
    """
    env = dict(os.environ)
    if server is not None:
        env["BETTERCOMPUTE_URL"] = server
    if token is not None:
        env["BETTERCOMPUTE_TOKEN"] = token
    program, *args = command
    params = StdioServerParameters(command=program, args=[*args, "mcp"], env=env)
    failure: AgentError | None = None
    async with mcp.Client(params) as client:
        try:
            return await _reserve(client, pool_name, gpus=gpus, duration=duration)
        except AgentError as exc:
            # Raised once the client is closed: inside, its task group would wrap the error in a group.
            failure = exc
    raise failure


async def _reserve(client: mcp.Client, pool_name: str, *, gpus: int, duration: str) -> Reserved:
    tools = (await client.list_tools()).tools
    read_only = [t.name for t in tools if t.annotations is not None and t.annotations.read_only_hint]
    me = _data("system_whoami", await client.call_tool("system_whoami", {}))
    tenant = me["tenant_id"]
    cursor = None
    pool_id = None
    while pool_id is None:  # list methods page: follow next_cursor until the pool turns up
        page = _data("pools_list", await client.call_tool("pools_list", {"tenant": tenant, "cursor": cursor}))
        pool_id = next((p["id"] for p in page["pools"] if p["name"] == pool_name), None)
        cursor = page["next_cursor"]
        if pool_id is None and cursor is None:
            raise AgentError("pools_list", "NOT_FOUND", f"no pool named {pool_name!r} in {tenant}")
    request = {
        "tenant": tenant,
        "pool_id": pool_id,
        "gpus": gpus,
        "duration": duration,
        "idempotency_key": f"agent-{uuid.uuid4().hex}",  # one key per intent: retries of it reserve once
    }
    reservation = _data("reservations_create", await client.call_tool("reservations_create", request))
    return Reserved(tools=[t.name for t in tools], read_only=read_only, pool_id=pool_id, reservation=reservation)
