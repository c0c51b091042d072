"""A control plane for unit tests: a PostgreSQL store that is never reached, and a named IAM test double."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest

from bettercompute import BetterCompute, Options, better_compute
from bettercompute.testing import StaticIamDouble, identity
from bettercompute_store_pg import PgStore

# Nothing listens on port 1: any attempt to reach the database fails at once, which several tests rely on.
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/none"
ROOT = "root-credential"
MEMBER = "member-credential"
OTHER_TENANT = "other-tenant-credential"
# A member of the same tenant as MEMBER who may call nothing of the echo group.
BYSTANDER = "bystander-credential"


def make_iam() -> StaticIamDouble:
    return StaticIamDouble(
        {
            ROOT: identity("root-admin"),
            MEMBER: identity("alice", tenant="acme"),
            OTHER_TENANT: identity("mallory", tenant="evil"),
            BYSTANDER: identity("bob", tenant="acme"),
        },
        allowed={
            "root-admin": ["*"],
            "alice": ["compute:system:version", "compute:system:whoami", "compute:echo:say", "compute:echo:fail"],
            "mallory": ["*"],
            "bob": ["compute:system:version"],
        },
    )


def make_compute(modules: Sequence[Any] = (), plugins: Sequence[Any] = (), **options: Any) -> BetterCompute:
    return better_compute(
        Options(store=PgStore(UNREACHABLE), iam=make_iam(), modules=modules, plugins=plugins, **options)
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def http(request: pytest.FixtureRequest) -> AsyncIterator[httpx.AsyncClient]:
    compute: BetterCompute = request.getfixturevalue("compute")
    transport = httpx.ASGITransport(app=compute.asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client
