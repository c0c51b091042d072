"""The host's application: its own routes, and the control plane mounted under ``/compute``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from bettercompute import BetterCompute, Options, better_compute
from bettercompute.errors import ComputeError, InvalidInputError
from bettercompute.modules.pools import ListPoolsInput

__all__ = ["app_from_env", "make_app"]


def make_app(compute: BetterCompute) -> Starlette:
    """The host app around a composed (not yet initialized) control plane."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await compute.initialize()
        try:
            yield
        finally:
            await compute.close()

    async def home(request: Request) -> JSONResponse:
        return JSONResponse({"service": "host", "compute_api": "/compute/api/compute/"})

    async def pool_names(request: Request) -> JSONResponse:
        # The host's own route, calling the control plane in process on behalf of its caller.
        credential = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        try:
            try:
                asked = ListPoolsInput(tenant=request.query_params.get("tenant", ""))
            except ValueError:
                raise InvalidInputError("tenant: not a tenant id", details={"path": "tenant"}) from None
            page = await compute.api.pools.list(credential, asked)
        except ComputeError as exc:  # the same envelope the mounted API answers
            return JSONResponse(exc.to_envelope(), status_code=exc.http_status)
        return JSONResponse({"pools": [pool.name for pool in page.pools]})

    return Starlette(
        routes=[Route("/", home), Route("/pool-names", pool_names), Mount("/compute", app=compute.asgi)],
        lifespan=lifespan,
    )


def app_from_env() -> Starlette:
    """``make_app`` over the PostgreSQL at ``BETTERCOMPUTE_DATABASE_URL``, with the embedded IAM."""
    from bettercompute_iam import EmbeddedIam
    from bettercompute_store_pg import PgStore

    store = PgStore(os.environ["BETTERCOMPUTE_DATABASE_URL"])
    return make_app(better_compute(Options(store=store, iam=EmbeddedIam())))
