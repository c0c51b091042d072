"""The embedded IAM's caches expire: what another process changed is honoured here within ``cache_ttl``, no later.

A revoke, a disable or a binding change clears the caches of the process that made it at once (``test_cache.py``);
every other process with its own embedded IAM relies on the caches' expiry alone. Two control planes over one
schema show it with time moved by hand, and a second OS process shows it with real time.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import attrs
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from bettercompute import BetterCompute, Options, better_compute
from bettercompute.errors import AccessDeniedError, UnauthenticatedError
from bettercompute.modules.system import WhoamiInput
from bettercompute_iam import (
    CreateBindingInput,
    CreateCredentialInput,
    CreatePrincipalInput,
    CreateTenantInput,
    DeleteBindingInput,
    DisablePrincipalInput,
    EmbeddedIam,
    IamGroups,
    ListPrincipalsInput,
    RevokeCredentialInput,
)
from bettercompute_store_pg import PgStore
from tests._timing import deadline

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

TTL = dt.timedelta(seconds=30)
PEER = Path(__file__).with_name("_cache_peer.py")


@attrs.define
class FakeTimer:
    """A monotonic clock for the caches that moves only when the test says so."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, delta: dt.timedelta) -> None:
        self.now += delta.total_seconds()


@contextlib.asynccontextmanager
async def control_plane(
    url: str, schema: str, instance: str, *, timer: FakeTimer | None = None
) -> AsyncIterator[tuple[BetterCompute, EmbeddedIam]]:
    """A control plane over ``schema`` with an embedded IAM of its own (caches ``TTL``, on ``timer`` if given)."""
    iam = EmbeddedIam(cache_ttl=TTL) if timer is None else EmbeddedIam(cache_ttl=TTL, timer=timer)
    compute = better_compute(Options(store=PgStore(url, schema=schema, pool_size=2), iam=iam, instance=instance))
    await compute.initialize()
    try:
        yield compute, iam
    finally:
        await compute.close()


@attrs.frozen(kw_only=True)
class People:
    root: str
    tenant: str
    principals: dict[str, str]
    credentials: dict[str, str]
    credential_ids: dict[str, str]
    bindings: dict[str, str]


async def viewers(compute: BetterCompute, iam: EmbeddedIam, *names: str) -> People:
    """Bootstrap, then one tenant with a viewer (bound on the tenant, with a credential) per name."""
    boot = await iam.bootstrap()
    assert boot.credential is not None
    api, root = compute.api, boot.credential
    tenant = (await IamGroups(api).tenants.create(root, CreateTenantInput(name="acme"))).id
    people = People(root=root, tenant=tenant, principals={}, credentials={}, credential_ids={}, bindings={})
    for name in names:
        principal = await IamGroups(api).principals.create(
            root, CreatePrincipalInput(tenant=tenant, name=name, kind="user")
        )
        binding = await IamGroups(api).bindings.create(
            root,
            CreateBindingInput(tenant=tenant, principal_id=principal.id, role="compute.viewer", scope_type="tenant"),
        )
        minted = await IamGroups(api).credentials.create(
            root, CreateCredentialInput(tenant=tenant, principal_id=principal.id, expires_in_seconds=None)
        )
        people.principals[name] = principal.id
        people.credentials[name] = minted.credential
        people.credential_ids[name] = minted.id
        people.bindings[name] = binding.id
    return people


async def test_a_credential_revoked_or_disabled_elsewhere_stops_here_once_the_ttl_passes(
    database_url: str, fresh_schema: str
) -> None:
    timer = FakeTimer()
    async with (
        control_plane(database_url, fresh_schema, "a", timer=timer) as (a, a_iam),
        control_plane(database_url, fresh_schema, "b", timer=timer) as (b, _),
    ):
        people = await viewers(a, a_iam, "bob", "dave")
        bob, dave = people.credentials["bob"], people.credentials["dave"]
        for credential in (bob, dave):  # b authenticates both once, and caches them
            await b.api.system.whoami(credential, WhoamiInput())

        await IamGroups(a.api).credentials.revoke(
            people.root, RevokeCredentialInput(tenant=people.tenant, credential_id=people.credential_ids["bob"])
        )
        await IamGroups(a.api).principals.disable(
            people.root, DisablePrincipalInput(tenant=people.tenant, principal_id=people.principals["dave"])
        )
        for credential in (bob, dave):
            with pytest.raises(UnauthenticatedError):  # the process that changed them knows at once
                await a.api.system.whoami(credential, WhoamiInput())
            # The other process trusts its cache until the TTL has passed, and not a moment after.
            assert (await b.api.system.whoami(credential, WhoamiInput())).tenant_id == people.tenant
        timer.advance(TTL - dt.timedelta(seconds=1))
        for credential in (bob, dave):
            assert (await b.api.system.whoami(credential, WhoamiInput())).tenant_id == people.tenant
        timer.advance(dt.timedelta(seconds=1))
        for credential in (bob, dave):
            with pytest.raises(UnauthenticatedError):
                await b.api.system.whoami(credential, WhoamiInput())


async def test_a_binding_removed_elsewhere_stops_allowing_here_once_the_ttl_passes(
    database_url: str, fresh_schema: str
) -> None:
    timer = FakeTimer()
    async with (
        control_plane(database_url, fresh_schema, "a", timer=timer) as (a, a_iam),
        control_plane(database_url, fresh_schema, "b", timer=timer) as (b, _),
    ):
        people = await viewers(a, a_iam, "carol")
        carol, listing = people.credentials["carol"], ListPrincipalsInput(tenant=people.tenant)
        assert await IamGroups(b.api).principals.list(carol, listing)  # b caches carol's grants

        await IamGroups(a.api).bindings.delete(
            people.root, DeleteBindingInput(tenant=people.tenant, binding_id=people.bindings["carol"])
        )
        with pytest.raises(AccessDeniedError):
            await IamGroups(a.api).principals.list(carol, listing)
        timer.advance(TTL - dt.timedelta(seconds=1))
        assert await IamGroups(b.api).principals.list(carol, listing)
        timer.advance(dt.timedelta(seconds=1))
        with pytest.raises(AccessDeniedError):
            await IamGroups(b.api).principals.list(carol, listing)


async def test_another_os_process_stops_honouring_a_revoke_and_a_removed_binding(
    database_url: str, fresh_schema: str
) -> None:
    async with control_plane(database_url, fresh_schema, "a") as (a, a_iam):
        people = await viewers(a, a_iam, "bob", "carol")
        args = [database_url, fresh_schema, "2", people.tenant, people.credentials["bob"], people.credentials["carol"]]
        async with await anyio.open_process([sys.executable, str(PEER), *args]) as peer:
            assert peer.stdin is not None and peer.stdout is not None
            lines = BufferedByteReceiveStream(peer.stdout)
            try:
                with anyio.fail_after(deadline(60)):
                    assert await lines.receive_until(b"\n", 100) == b"ready"
                await IamGroups(a.api).credentials.revoke(
                    people.root, RevokeCredentialInput(tenant=people.tenant, credential_id=people.credential_ids["bob"])
                )
                await IamGroups(a.api).bindings.delete(
                    people.root, DeleteBindingInput(tenant=people.tenant, binding_id=people.bindings["carol"])
                )
                await peer.stdin.send(b"changed\n")
                with anyio.fail_after(deadline(90)):
                    assert await lines.receive_until(b"\n", 100) == b"expired"
                with anyio.fail_after(deadline(30)):
                    assert await peer.wait() == 0
            finally:
                if peer.returncode is None:
                    peer.kill()
