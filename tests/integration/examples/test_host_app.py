"""The example host application (``examples/host_app``) served by uvicorn: its own routes next to the mounted
control plane, whose lifespan it runs, and a route of its own calling the control plane in process."""

from __future__ import annotations

import httpx
import pytest

from bettercompute import Options, better_compute
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore
from examples.host_app import make_app

from ._serve import serving

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def test_the_host_app_serves_its_routes_and_the_mounted_control_plane(
    database_url: str, fresh_schema: str
) -> None:
    iam = EmbeddedIam()
    compute = better_compute(Options(store=PgStore(database_url, schema=fresh_schema, pool_size=4), iam=iam))
    async with serving(make_app(compute)) as base:
        root = (await iam.bootstrap()).credential  # the host's lifespan initialized the control plane
        assert root is not None
        bearer = {"authorization": f"Bearer {root}"}
        async with httpx.AsyncClient(base_url=base) as client:
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
