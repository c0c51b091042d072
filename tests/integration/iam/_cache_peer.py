"""Another control-plane process with its own embedded IAM, for the cache expiry test.

``python _cache_peer.py URL SCHEMA TTL_SECONDS TENANT REVOKED_CREDENTIAL UNBOUND_CREDENTIAL`` composes a control plane
over the same schema, uses both credentials (so that this process caches the first one's identity and the second
one's grants), prints ``ready``, waits for a line on stdin (the parent has then revoked the first credential and
removed the second one's binding) and prints ``expired`` once this process refuses both, or ``stale`` if it still
honours either a minute later.
"""

from __future__ import annotations

import datetime as dt
import sys

import anyio

from bettercompute import Options, better_compute
from bettercompute.errors import AccessDeniedError, UnauthenticatedError
from bettercompute.modules.system import WhoamiInput
from bettercompute_iam import EmbeddedIam, IamGroups, ListPrincipalsInput
from bettercompute_store_pg import PgStore


async def _main(url: str, schema: str, ttl: float, tenant: str, revoked: str, unbound: str) -> None:
    iam = EmbeddedIam(cache_ttl=dt.timedelta(seconds=ttl))
    compute = better_compute(Options(store=PgStore(url, schema=schema, pool_size=2), iam=iam, instance="peer"))
    await compute.initialize()
    try:
        await compute.api.system.whoami(revoked, WhoamiInput())
        await IamGroups(compute.api).principals.list(unbound, ListPrincipalsInput(tenant=tenant))
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        with anyio.move_on_after(60):
            while True:
                try:
                    await compute.api.system.whoami(revoked, WhoamiInput())
                except UnauthenticatedError:
                    try:
                        await IamGroups(compute.api).principals.list(unbound, ListPrincipalsInput(tenant=tenant))
                    except AccessDeniedError:
                        print("expired", flush=True)
                        return
                await anyio.sleep(0.1)
        print("stale", flush=True)
    finally:
        await compute.close()


if __name__ == "__main__":
    anyio.run(_main, sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6])
