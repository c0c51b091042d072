"""IAM's method groups on a whole control plane (real PostgreSQL, the embedded IAM): helpers and fixtures.

The ``plane`` fixture is shared by all integration tests: a fresh schema, a bootstrapped root credential, and an
httpx client over ASGITransport.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest

from bettercompute import BetterCompute, Options, better_compute
from bettercompute_iam import (
    CreateBindingInput,
    CreateCredentialInput,
    CreatePrincipalInput,
    CreateTenantInput,
    EmbeddedIam,
    IamGroups,
)
from bettercompute_store_pg import PgStore

from ..conftest import Plane as Plane


def auth(credential: str) -> dict[str, str]:
    """The header that carries a credential."""
    return {"authorization": f"Bearer {credential}"}


async def post(plane: Plane, credential: str, path: str, body: dict[str, Any]) -> httpx.Response:
    """``POST /api/compute/<group>/<method>`` with a credential."""
    return await plane.http.post(f"/api/compute/{path}", headers=auth(credential), json=body)


def data(response: httpx.Response) -> Any:
    """The ``data`` of a successful response (fails the test with the error envelope otherwise)."""
    assert response.status_code == 200, response.text
    return response.json()["data"]


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The ``error`` of a failed response, after checking its status and code."""
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()["error"]
    assert body["code"] == code, body
    return body


@attrs.frozen(kw_only=True)
class Acme:
    """Tenant acme with alice, who holds ``compute.admin`` on it and a credential; and a second tenant, globex."""

    tenant: str
    alice: str
    alice_credential: str
    alice_credential_id: str
    alice_binding: str
    other_tenant: str


async def make_user(
    plane: Plane, tenant: str, name: str, role: str, *, by: str | None = None, expires_in_seconds: int | None = None
) -> tuple[str, str, str]:
    """A user of ``tenant`` with ``role`` bound on the tenant and a credential: (principal id, credential, binding)."""
    api = plane.compute.api
    caller = by or plane.root
    principal = await IamGroups(api).principals.create(
        caller, CreatePrincipalInput(tenant=tenant, name=name, kind="user")
    )
    binding = await IamGroups(api).bindings.create(
        caller, CreateBindingInput(tenant=tenant, principal_id=principal.id, role=role, scope_type="tenant")
    )
    created = await IamGroups(api).credentials.create(
        caller,
        CreateCredentialInput(tenant=tenant, principal_id=principal.id, expires_in_seconds=expires_in_seconds),
    )
    return principal.id, created.credential, binding.id


@pytest.fixture
async def acme(plane: Plane) -> Acme:
    api = plane.compute.api
    tenant = await IamGroups(api).tenants.create(plane.root, CreateTenantInput(name="acme"))
    other = await IamGroups(api).tenants.create(plane.root, CreateTenantInput(name="globex"))
    alice, credential, binding = await make_user(plane, tenant.id, "alice", "compute.admin")
    return Acme(
        tenant=tenant.id,
        alice=alice,
        alice_credential=credential,
        alice_credential_id=credential.removeprefix("bcak_").split(".")[0],
        alice_binding=binding,
        other_tenant=other.id,
    )


@attrs.frozen(kw_only=True)
class TwoTenants:
    """A control plane with tenants acme and globex, each with an admin holding a credential (alice, mallory)."""

    compute: BetterCompute
    store: PgStore
    root: str
    acme: str
    alice: str
    globex: str
    mallory: str
    http: httpx.AsyncClient


@contextlib.asynccontextmanager
async def two_tenants(database_url: str, schema: str, **options: Any) -> AsyncIterator[TwoTenants]:
    """Compose, initialize and bootstrap a control plane (with ``options``), then add the two tenants."""
    store = PgStore(database_url, schema=schema, pool_size=4)
    iam = EmbeddedIam()
    compute = better_compute(Options(store=store, iam=iam, instance="test-1", **options))
    await compute.initialize()
    try:
        boot = await iam.bootstrap()
        assert boot.credential is not None
        root = boot.credential
        holder: Any = attrs.make_class("P", ["compute", "root"])(compute, root)
        acme = (await IamGroups(compute.api).tenants.create(root, CreateTenantInput(name="acme"))).id
        globex = (await IamGroups(compute.api).tenants.create(root, CreateTenantInput(name="globex"))).id
        _, alice, _ = await make_user(holder, acme, "alice", "compute.admin")
        _, mallory, _ = await make_user(holder, globex, "mallory", "compute.admin")
        transport = httpx.ASGITransport(app=compute.asgi)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield TwoTenants(
                compute=compute,
                store=store,
                root=root,
                acme=acme,
                alice=alice,
                globex=globex,
                mallory=mallory,
                http=http,
            )
    finally:
        await compute.close()
