"""No IAM request holds two pooled connections: a burst larger than the pool completes instead of stalling.

A request that read grants on a second connection while its transaction held the first could deadlock the pool:
once every connection was held by such a transaction, each waited for a second one until the pool's timeout, and the
whole burst failed with ``UNAVAILABLE``. These tests run bursts of four times ``max_in_flight`` calls of every
mutating IAM method against a pool of one connection more (the one the worker roles keep), and count the store's
checkouts during each single call. In process nothing caps the calls, so the burst there is larger than the pool.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import anyio
import httpx
import pytest

from bettercompute.errors import ComputeError
from bettercompute.modules.pools import CreatePoolInput
from bettercompute_iam import (
    CreateBindingInput,
    CreateCredentialInput,
    CreatePrincipalInput,
    CreateRoleInput,
    CreateTenantInput,
    DeleteBindingInput,
    DisablePrincipalInput,
    IamGroups,
    ListBindingsInput,
    ListCredentialsInput,
    ListPrincipalsInput,
    ListRolesInput,
    ListTenantsInput,
    RevokeCredentialInput,
)
from bettercompute_store_pg import PgStore, PoolUsage
from tests._timing import deadline

from .conftest import TwoTenants, auth, two_tenants

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

T = TypeVar("T")
IN_FLIGHT = 3
BURST = 4 * IN_FLIGHT


@contextlib.contextmanager
def metered(store: PgStore) -> Iterator[PoolUsage]:
    """The store's pool usage: every checkout, by the transaction path and the one-round-trip path alike."""
    yield store.pool_usage


@pytest.fixture
async def plane(database_url: str, fresh_schema: str) -> Any:
    # The smallest pool the cap allows: in-process bursts of requests that each need two connections starve it. The
    # queue holds a whole burst, so that HTTP waits rather than sheds (tests/integration/core/test_load_shedding.py).
    async with two_tenants(database_url, fresh_schema, max_in_flight=IN_FLIGHT, max_queued=BURST) as t:
        assert t.store._pool_size == IN_FLIGHT + 1  # the premise of these tests
        yield t


async def burst(call: Callable[[int], Awaitable[T]]) -> list[T]:
    """``call(i)`` for every ``i`` of the burst, all at once; their results in order, or the test fails naming every
    error code seen."""
    results: dict[int, T] = {}
    failures: list[str] = []

    async def one(index: int) -> None:
        try:
            results[index] = await call(index)
        except ComputeError as exc:
            failures.append(exc.code)

    with anyio.fail_after(deadline(60)):
        async with anyio.create_task_group() as tg:
            for index in range(BURST):
                tg.start_soon(one, index)
    assert failures == [], f"{len(failures)} of {BURST} calls failed: {sorted(set(failures))}"
    return [results[i] for i in range(BURST)]


async def http_burst(t: TwoTenants, credential: str, path: str, bodies: list[dict[str, Any]]) -> list[Any]:
    """POST every body at once through the ASGI app (its in-flight cap included); the ``data`` of each answer."""
    responses: list[httpx.Response | None] = [None] * len(bodies)

    async def one(index: int) -> None:
        responses[index] = await t.http.post(f"/api/compute/{path}", headers=auth(credential), json=bodies[index])

    with anyio.fail_after(deadline(60)):
        async with anyio.create_task_group() as tg:
            for index in range(len(bodies)):
                tg.start_soon(one, index)
    statuses = [r.status_code if r is not None else None for r in responses]
    assert statuses == [200] * len(bodies), [r.text for r in responses if r is not None and r.status_code != 200]
    return [r.json()["data"] for r in responses if r is not None]


async def test_a_burst_of_every_mutating_iam_method_completes(plane: TwoTenants) -> None:
    t, api = plane, plane.compute.api
    tenants = await burst(lambda i: IamGroups(api).tenants.create(t.root, CreateTenantInput(name=f"burst-{i}")))
    assert len({x.id for x in tenants}) == BURST
    principals = await burst(
        lambda i: IamGroups(api).principals.create(
            t.alice, CreatePrincipalInput(tenant=t.acme, name=f"p-{i}", kind="user")
        )
    )
    roles = await burst(
        lambda i: IamGroups(api).roles.create(
            t.alice, CreateRoleInput(tenant=t.acme, name=f"r-{i}", actions=("iam:principals:list",))
        )
    )
    bindings = await burst(
        lambda i: IamGroups(api).bindings.create(
            t.alice,
            CreateBindingInput(tenant=t.acme, principal_id=principals[i].id, role=roles[i].id, scope_type="tenant"),
        )
    )
    credentials = await burst(
        lambda i: IamGroups(api).credentials.create(
            t.alice, CreateCredentialInput(tenant=t.acme, principal_id=principals[i].id, expires_in_seconds=None)
        )
    )
    revoked = await burst(
        lambda i: IamGroups(api).credentials.revoke(
            t.alice, RevokeCredentialInput(tenant=t.acme, credential_id=credentials[i].id)
        )
    )
    assert all(c.state == "revoked" for c in revoked)
    await burst(
        lambda i: IamGroups(api).bindings.delete(t.alice, DeleteBindingInput(tenant=t.acme, binding_id=bindings[i].id))
    )
    disabled = await burst(
        lambda i: IamGroups(api).principals.disable(
            t.alice, DisablePrincipalInput(tenant=t.acme, principal_id=principals[i].id)
        )
    )
    assert all(p.disabled_at is not None for p in disabled)


async def test_a_burst_over_http_gets_no_503(plane: TwoTenants) -> None:
    t, api = plane, plane.compute.api
    people = [
        await IamGroups(api).principals.create(t.alice, CreatePrincipalInput(tenant=t.acme, name=f"h-{i}", kind="user"))
        for i in range(BURST)
    ]
    minted = await http_burst(
        t,
        t.alice,
        "credentials/create",
        [{"tenant": t.acme, "principal_id": p.id, "expires_in_seconds": None} for p in people],
    )
    assert len({m["id"] for m in minted}) == BURST
    disabled = await http_burst(
        t, t.alice, "principals/disable", [{"tenant": t.acme, "principal_id": p.id} for p in people]
    )
    assert all(d["disabled_at"] is not None for d in disabled)


Metered = Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]]
"""``call(name, run)``: run one API call, recording the most pooled connections it held at once under ``name``."""


async def _principal_role_and_binding_calls(call: Metered, t: TwoTenants, pool_id: str) -> tuple[Any, Any]:
    """Tenants, principals, roles and bindings made and listed, one metered call each: (bob, his pool binding)."""
    api = t.compute.api
    await call("tenants.create", lambda: IamGroups(api).tenants.create(t.root, CreateTenantInput(name="metered")))
    await call("tenants.list", lambda: IamGroups(api).tenants.list(t.root, ListTenantsInput()))
    bob = await call(
        "principals.create",
        lambda: IamGroups(api).principals.create(t.alice, CreatePrincipalInput(tenant=t.acme, name="bob", kind="user")),
    )
    await call("principals.list", lambda: IamGroups(api).principals.list(t.alice, ListPrincipalsInput(tenant=t.acme)))
    role = await call(
        "roles.create",
        lambda: IamGroups(api).roles.create(
            t.alice, CreateRoleInput(tenant=t.acme, name="lister", actions=("iam:*:list",))
        ),
    )
    await call("roles.list", lambda: IamGroups(api).roles.list(t.alice, ListRolesInput(tenant=t.acme)))
    await call(
        "bindings.create (tenant)",
        lambda: IamGroups(api).bindings.create(
            t.alice, CreateBindingInput(tenant=t.acme, principal_id=bob.id, role=role.id, scope_type="tenant")
        ),
    )
    on_pool = await call(
        "bindings.create (pool)",
        lambda: IamGroups(api).bindings.create(
            t.alice,
            CreateBindingInput(
                tenant=t.acme, principal_id=bob.id, role="compute.member", scope_type="pool", scope_id=pool_id
            ),
        ),
    )
    await call("bindings.list", lambda: IamGroups(api).bindings.list(t.alice, ListBindingsInput(tenant=t.acme)))
    return bob, on_pool


async def _credential_and_removal_calls(call: Metered, t: TwoTenants, bob: Any, on_pool: Any) -> None:
    """Credentials made, listed and revoked, the pool binding deleted and bob disabled, one metered call each."""
    api = t.compute.api
    created = await call(
        "credentials.create",
        lambda: IamGroups(api).credentials.create(
            t.alice, CreateCredentialInput(tenant=t.acme, principal_id=bob.id, expires_in_seconds=None)
        ),
    )
    await call(
        "credentials.list", lambda: IamGroups(api).credentials.list(t.alice, ListCredentialsInput(tenant=t.acme))
    )
    await call(
        "credentials.revoke",
        lambda: IamGroups(api).credentials.revoke(
            t.alice, RevokeCredentialInput(tenant=t.acme, credential_id=created.id)
        ),
    )
    await call(
        "bindings.delete",
        lambda: IamGroups(api).bindings.delete(t.alice, DeleteBindingInput(tenant=t.acme, binding_id=on_pool.id)),
    )
    await call(
        "principals.disable",
        lambda: IamGroups(api).principals.disable(t.alice, DisablePrincipalInput(tenant=t.acme, principal_id=bob.id)),
    )


async def test_each_iam_call_holds_one_pooled_connection_at_a_time(plane: TwoTenants) -> None:
    t, api = plane, plane.compute.api
    # A pool of acme, so that a pool-scoped binding (whose check reads the pool's tenant) is among the calls.
    pool = await api.pools.create(t.alice, CreatePoolInput(tenant=t.acme, name="gpus"))
    peaks: dict[str, int] = {}
    with metered(t.store) as meter:

        async def call(name: str, run: Callable[[], Awaitable[Any]]) -> Any:
            meter.reset_peak()
            result = await run()
            peaks[name] = meter.peak
            return result

        bob, on_pool = await _principal_role_and_binding_calls(call, t, pool.id)
        await _credential_and_removal_calls(call, t, bob, on_pool)
        # The same over HTTP, through the ASGI app.
        carol = await IamGroups(api).principals.create(
            t.alice, CreatePrincipalInput(tenant=t.acme, name="carol", kind="user")
        )

        async def over_http() -> None:
            body = {"tenant": t.acme, "principal_id": carol.id, "expires_in_seconds": None}
            answer = await t.http.post("/api/compute/credentials/create", headers=auth(t.alice), json=body)
            assert answer.status_code == 200, answer.text

        await call("credentials.create over HTTP", over_http)
    assert peaks == dict.fromkeys(peaks, 1)
