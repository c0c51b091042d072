"""The example host application (``examples/host_app``) served by uvicorn: its own routes next to the mounted
control plane, whose lifespan it runs, and a route of its own calling the control plane in process."""

from __future__ import annotations

import asyncio
import socket

import anyio
import httpx
import pytest
import uvicorn

from bettercompute import Options, better_compute
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore
from examples.host_app import make_app

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_host_app_serves_its_routes_and_the_mounted_control_plane(
    database_url: str, fresh_schema: str
) -> None:
    iam = EmbeddedIam()
    compute = better_compute(Options(store=PgStore(database_url, schema=fresh_schema, pool_size=4), iam=iam))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(compute), host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    try:
        with anyio.fail_after(30):
            while not server.started:  # noqa: ASYNC110 - uvicorn offers a flag, not an event
                await anyio.sleep(0.01)
        root = (await iam.bootstrap()).credential  # the host's lifespan initialized the control plane
        assert root is not None
        bearer = {"authorization": f"Bearer {root}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/")).json()["compute_api"] == "/compute/api/compute/"
            assert (await client.get("/compute/healthz")).json() == {"status": "ok"}
            made = await client.post(
                "/compute/api/compute/pools/create", headers=bearer, json={"tenant": "root", "name": "gpus"}
            )
            assert made.status_code == 200, made.text
            names = await client.get("/pool-names", params={"tenant": "root"}, headers=bearer)
            assert names.json() == {"pools": ["gpus"]}
            # The host's route answers the control plane's envelopes: no credential, a bad tenant id.
            anonymous = await client.get("/pool-names", params={"tenant": "root"})
            assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "UNAUTHENTICATED"
            bad = await client.get("/pool-names", params={"tenant": "a b\x00"}, headers=bearer)
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "INVALID_INPUT"
            missing = await client.post("/compute/api/compute/pools/nope", headers=bearer, json={})
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "NOT_FOUND"
    finally:
        server.should_exit = True
        await serving
