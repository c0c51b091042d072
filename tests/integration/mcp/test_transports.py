"""``better-compute mcp`` as an agent runs it: a subprocess on stdio against a control plane served over HTTP, and
the streamable HTTP server, where each request's bearer token is the caller (a request without one is refused)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp
import pytest
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from bettercompute.modules.pools import CreatePoolInput, Pool, PoolsGroup
from bettercompute_cli._groups import group_names
from bettercompute_cli._mcp import InProcess, streamable_http_app
from bettercompute_cli._profiles import Profiles
from examples.maintenance import MaintenanceModule
from tests._timing import deadline

from ..cli.conftest import StartCli, command, free_port
from ..examples._serve import serving
from ..iam.conftest import two_tenants
from .conftest import Fleet, envelope

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@pytest.fixture
async def served(fleet: Fleet) -> AsyncIterator[str]:
    async with serving(fleet.t.compute.asgi, lifespan="off") as base:
        yield base


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTERCOMPUTE_") and k != "TOKEN"}
    # No profile of whoever runs the tests (a test that wants one names its own file).
    nowhere = Path(tempfile.gettempdir()) / f"bettercompute-no-profiles-{os.getpid()}" / "none.toml"
    return {**env, "BETTERCOMPUTE_PROFILES": str(nowhere), **extra}


def _stdio(base: str, token: str) -> mcp.Client:
    (program, *args) = command()
    env = _env(BETTERCOMPUTE_URL=base, BETTERCOMPUTE_TOKEN=token)
    return mcp.Client(StdioServerParameters(command=program, args=[*args, "mcp"], env=env))


async def test_over_stdio_a_subprocess_lists_calls_and_is_refused(fleet: Fleet, served: str) -> None:
    t = fleet.t
    async with _stdio(served, t.alice) as alice:
        names = {tool.name for tool in (await alice.list_tools()).tools}
        assert names == {f"{m.group}_{m.name}" for m in t.compute.registry.methods()}
        made = envelope(
            await alice.call_tool(
                "reservations_create", {"tenant": t.acme, "pool_id": fleet.pool, "gpus": 1, "duration": "PT1H"}
            )
        )["data"]
        assert made["state"] == "placed" and made["placement"][0]["node_id"] == fleet.nodes[0]
    async with _stdio(served, fleet.viewer) as vic:
        refused = await vic.call_tool("reservations_cancel", {"id": made["id"]})
        assert refused.is_error and envelope(refused)["error"]["code"] == "ACCESS_DENIED"
    async with _stdio(served, t.alice) as alice:
        still = envelope(await alice.call_tool("reservations_get", {"id": made["id"]}))["data"]
        assert still["state"] != "cancelled"


async def test_over_stdio_the_profile_saved_by_login_is_used(fleet: Fleet, served: str, tmp_path: Path) -> None:
    profiles = tmp_path / "profiles.toml"
    Profiles.load(profiles).put("lab", served, fleet.t.alice)
    (program, *args) = command()
    env = _env(BETTERCOMPUTE_PROFILES=str(profiles), BETTERCOMPUTE_PROFILE="lab")
    async with mcp.Client(StdioServerParameters(command=program, args=[*args, "mcp"], env=env)) as alice:
        who = envelope(await alice.call_tool("system_whoami", {}))["data"]
        assert who["tenant_id"] == fleet.t.acme
    done = await anyio.run_process([*command(), "mcp", "--profile", "nope"], env=env, check=False)
    assert done.returncode == 2 and b"no profile 'nope'" in done.stderr and b"Traceback" not in done.stderr


async def test_stdio_without_a_credential_or_a_server_says_so(served: str) -> None:
    done = await anyio.run_process([*command(), "mcp"], env=_env(BETTERCOMPUTE_URL=served), check=False)
    assert done.returncode == 2 and b"credential" in done.stderr and b"Traceback" not in done.stderr
    done = await anyio.run_process(
        [*command(), "mcp", "--token", "bcak_a\nb"], env=_env(BETTERCOMPUTE_URL=served), check=False
    )
    assert done.returncode == 2 and b"printable ASCII" in done.stderr
    nowhere = f"http://127.0.0.1:{free_port()}"
    async with mcp.Client(
        StdioServerParameters(
            command=command()[0], args=[*command()[1:], "mcp"], env=_env(BETTERCOMPUTE_URL=nowhere, TOKEN="bcak_x.y")
        )
    ) as client:
        answer = envelope(await client.call_tool("pools_list", {"tenant": "tn_x"}))
        assert answer["error"]["code"] == "UNAVAILABLE"
        with pytest.raises(MCPError, match="UNAVAILABLE"):  # no document, no tools: a protocol error
            await client.list_tools()


async def test_over_stdio_the_tools_are_the_servers_a_third_party_modules_included(
    database_url: str, fresh_schema: str
) -> None:
    assert "maintenance" not in group_names()  # the command itself knows nothing of the module
    async with (
        two_tenants(database_url, fresh_schema, modules=[MaintenanceModule()]) as t,
        serving(t.compute.asgi, lifespan="off") as base,
        _stdio(base, t.alice) as alice,
    ):
        tools = {tool.name: tool for tool in (await alice.list_tools()).tools}
        assert {"maintenance_create", "maintenance_list"} <= set(tools)
        assert tools["maintenance_list"].annotations.read_only_hint is True  # type: ignore[union-attr]
        pools: PoolsGroup[Any] = t.compute.api.group(PoolsGroup)
        pool: Pool = await pools.create(t.alice, CreatePoolInput(tenant=t.acme, name="gpus"))
        window = {
            "tenant": t.acme,
            "pool_id": pool.id,
            "starts_at": "2030-01-01T00:00:00Z",
            "ends_at": "2030-01-01T02:00:00Z",
            "reason": "firmware",
        }
        made = envelope(await alice.call_tool("maintenance_create", window))["data"]
        listed = envelope(await alice.call_tool("maintenance_list", {"tenant": t.acme}))["data"]
        assert [w["id"] for w in listed["windows"]] == [made["id"]]


@contextlib.asynccontextmanager
async def _http_client(url: str, token: str) -> AsyncIterator[mcp.Client]:
    # The SDK leaves a client it was given open: this block closes it.
    async with (
        httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}) as http,
        mcp.Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


async def _whoami(url: str, token: str) -> Any:
    async with _http_client(url, token) as client:
        return envelope(await client.call_tool("system_whoami", {}))


async def test_streamable_http_takes_the_caller_from_each_request(fleet: Fleet) -> None:
    t = fleet.t
    async with serving(streamable_http_app(InProcess(t.compute))) as base:
        url = f"{base}/mcp"
        alice, vic = await _whoami(url, t.alice), await _whoami(url, fleet.viewer)
        assert alice["data"]["tenant_id"] == vic["data"]["tenant_id"] == t.acme
        assert alice["data"]["principal_id"] != vic["data"]["principal_id"]
        async with _http_client(url, fleet.viewer) as viewer:
            assert "reservations_create" in {tool.name for tool in (await viewer.list_tools()).tools}
            refused = envelope(
                await viewer.call_tool(
                    "reservations_create", {"tenant": t.acme, "pool_id": fleet.pool, "gpus": 1, "duration": "PT1H"}
                )
            )
            assert refused["error"]["code"] == "ACCESS_DENIED"
        bad = await _whoami(url, "bcak_nope.nope")
        assert bad["error"]["code"] == "UNAUTHENTICATED"
        async with httpx.AsyncClient() as raw:
            for headers in ({}, {"authorization": "Basic YTpi"}, {"authorization": "Bearer"}):
                answer = await raw.post(
                    url,
                    json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                    headers={**headers, "accept": "application/json, text/event-stream"},
                )
                assert answer.status_code == 401, headers
                assert answer.headers["www-authenticate"].startswith("Bearer")
                assert answer.json()["error"]["code"] == "UNAUTHENTICATED"


async def test_the_http_command_forwards_each_requests_token(fleet: Fleet, served: str, start_cli: StartCli) -> None:
    port = free_port()
    running = start_cli(_env(BETTERCOMPUTE_URL=served, TOKEN=fleet.t.alice), "mcp", "--http", "--port", str(port))
    running.wait_for("MCP over streamable HTTP", in_stderr=True)
    url = f"http://127.0.0.1:{port}/mcp"
    with anyio.fail_after(deadline(30)):
        while True:
            try:
                async with httpx.AsyncClient() as raw:
                    if (await raw.post(url)).status_code == 401:  # no token: the one exported is not used
                        break
            except httpx.TransportError:
                await anyio.sleep(0.1)
    vic = await _whoami(url, fleet.viewer)
    assert vic["data"]["tenant_id"] == fleet.t.acme
    alice = await _whoami(url, fleet.t.alice)
    assert alice["data"]["principal_id"] != vic["data"]["principal_id"]
    assert running.stop() == 0
