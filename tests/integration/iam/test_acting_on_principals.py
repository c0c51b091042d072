"""One rule for acting on a principal: hold everything it holds, where a tenant's grant covers the tenant's pools.

The rule (``bettercompute_iam._service.may_act_on``) guards minting and revoking a principal's credentials,
disabling it and taking its bindings away; ``bindings.create`` checks what is given with the same scope containment.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from bettercompute.errors import AccessDeniedError, UnauthenticatedError
from bettercompute.modules.pools import CreatePoolInput, Pool
from bettercompute.modules.system import WhoamiInput
from bettercompute_iam import (
    CreateBindingInput,
    CreateCredentialInput,
    CreatePrincipalInput,
    CreateRoleInput,
    DeleteBindingInput,
    DisablePrincipalInput,
    IamGroups,
    ListCredentialsInput,
    RevokeCredentialInput,
)

from ..conftest import Plane
from .conftest import Acme, error, make_user, post

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def _pool(plane: Plane, credential: str, tenant: str, name: str) -> str:
    pool: Pool = await plane.compute.api.pools.create(credential, CreatePoolInput(tenant=tenant, name=name))
    return pool.id


async def _bound_on_pool(plane: Plane, tenant: str, name: str, pool: str) -> tuple[str, str, str, str]:
    """A user of ``tenant`` that root bound as a member of ``pool`` only: (principal, credential, its id, binding)."""
    api = plane.compute.api
    principal = await IamGroups(api).principals.create(
        plane.root, CreatePrincipalInput(tenant=tenant, name=name, kind="user")
    )
    binding = await IamGroups(api).bindings.create(
        plane.root,
        CreateBindingInput(
            tenant=tenant, principal_id=principal.id, role="compute.member", scope_type="pool", scope_id=pool
        ),
    )
    created = await IamGroups(api).credentials.create(
        plane.root, CreateCredentialInput(tenant=tenant, principal_id=principal.id, expires_in_seconds=None)
    )
    return principal.id, created.credential, created.id, binding.id


async def test_a_tenant_admin_binds_on_her_own_tenants_pools_only(plane: Plane, acme: Acme) -> None:
    api = plane.compute.api
    ours = await _pool(plane, acme.alice_credential, acme.tenant, "gpus")
    theirs = await _pool(plane, plane.root, acme.other_tenant, "gpus")
    bob = await IamGroups(api).principals.create(
        plane.root, CreatePrincipalInput(tenant=acme.tenant, name="bob", kind="user")
    )
    given = await IamGroups(api).bindings.create(
        acme.alice_credential,
        CreateBindingInput(
            tenant=acme.tenant, principal_id=bob.id, role="compute.admin", scope_type="pool", scope_id=ours
        ),
    )
    assert (given.scope_type, given.scope_id) == ("pool", ours)
    # Another tenant's pool, and a pool that does not exist, get the same refusal: neither lies in her tenant.
    body = {"tenant": acme.tenant, "principal_id": bob.id, "role": "compute.member", "scope_type": "pool"}
    refusals = [
        error(
            await post(plane, acme.alice_credential, "bindings/create", {**body, "scope_id": pool}),
            403,
            "ACCESS_DENIED",
        )
        for pool in (theirs, "pl_0123456789abcdef")
    ]
    assert refusals[0] == refusals[1]
    assert "compute:pools:list" in refusals[0]["details"]["missing"]  # what the member role holds
    # Root holds every pool.
    assert (
        await IamGroups(api).bindings.create(
            plane.root,
            CreateBindingInput(
                tenant=acme.tenant, principal_id=bob.id, role="compute.member", scope_type="pool", scope_id=theirs
            ),
        )
    ).scope_id == theirs


async def test_a_tenant_admin_manages_a_principal_bound_on_her_tenants_pool(plane: Plane, acme: Acme) -> None:
    api = plane.compute.api
    ours = await _pool(plane, acme.alice_credential, acme.tenant, "gpus")
    bob, _, bob_credential_id, bob_binding = await _bound_on_pool(plane, acme.tenant, "bob", ours)
    alice = acme.alice_credential
    minted = await IamGroups(api).credentials.create(
        alice, CreateCredentialInput(tenant=acme.tenant, principal_id=bob, expires_in_seconds=3600)
    )
    assert (await api.system.whoami(minted.credential, WhoamiInput())).principal_id == bob
    revoked = await IamGroups(api).credentials.revoke(
        alice, RevokeCredentialInput(tenant=acme.tenant, credential_id=bob_credential_id)
    )
    assert revoked.state == "revoked"
    await IamGroups(api).bindings.delete(alice, DeleteBindingInput(tenant=acme.tenant, binding_id=bob_binding))
    disabled = await IamGroups(api).principals.disable(
        alice, DisablePrincipalInput(tenant=acme.tenant, principal_id=bob)
    )
    assert disabled.disabled_at is not None


async def test_a_tenant_admin_cannot_act_on_a_principal_bound_on_another_tenants_pool(plane: Plane, acme: Acme) -> None:
    api = plane.compute.api
    theirs = await _pool(plane, plane.root, acme.other_tenant, "gpus")
    bob, bob_credential, bob_credential_id, bob_binding = await _bound_on_pool(plane, acme.tenant, "bob", theirs)
    alice = acme.alice_credential
    attempts: list[Callable[[], Awaitable[Any]]] = [
        lambda: IamGroups(api).credentials.create(
            alice, CreateCredentialInput(tenant=acme.tenant, principal_id=bob, expires_in_seconds=None)
        ),
        lambda: IamGroups(api).credentials.revoke(
            alice, RevokeCredentialInput(tenant=acme.tenant, credential_id=bob_credential_id)
        ),
        lambda: IamGroups(api).bindings.delete(alice, DeleteBindingInput(tenant=acme.tenant, binding_id=bob_binding)),
        lambda: IamGroups(api).principals.disable(alice, DisablePrincipalInput(tenant=acme.tenant, principal_id=bob)),
    ]
    for attempt in attempts:
        with pytest.raises(AccessDeniedError) as info:
            await attempt()
        assert "compute:pools:list" in info.value.details["missing"]
    # Nothing was written: bob's one credential still works, and he kept his binding.
    assert (await api.system.whoami(bob_credential, WhoamiInput())).principal_id == bob
    listed = await IamGroups(api).credentials.list(
        plane.root, ListCredentialsInput(tenant=acme.tenant, principal_id=bob)
    )
    assert [c.id for c in listed.credentials] == [bob_credential_id]


async def test_revoking_a_credential_is_guarded_like_disabling_its_principal(plane: Plane, acme: Acme) -> None:
    # A service account of acme that root bound on the root scope: acme's admin may neither revoke nor disable it.
    api = plane.compute.api
    svc = await IamGroups(api).principals.create(
        plane.root, CreatePrincipalInput(tenant=acme.tenant, name="svc", kind="service_account")
    )
    await IamGroups(api).bindings.create(
        plane.root,
        CreateBindingInput(tenant=acme.tenant, principal_id=svc.id, role="compute.operator", scope_type="root"),
    )
    minted = await IamGroups(api).credentials.create(
        plane.root, CreateCredentialInput(tenant=acme.tenant, principal_id=svc.id, expires_in_seconds=None)
    )
    body = {"tenant": acme.tenant, "credential_id": minted.id}
    refused = error(await post(plane, acme.alice_credential, "credentials/revoke", body), 403, "ACCESS_DENIED")
    assert "compute:*:*" in refused["details"]["missing"]
    assert (await api.system.whoami(minted.credential, WhoamiInput())).principal_id == svc.id
    # Root may.
    await IamGroups(api).credentials.revoke(
        plane.root, RevokeCredentialInput(tenant=acme.tenant, credential_id=minted.id)
    )
    with pytest.raises(UnauthenticatedError):
        await api.system.whoami(minted.credential, WhoamiInput())


async def test_whoever_holds_less_cannot_act_on_whoever_holds_more(plane: Plane, acme: Acme) -> None:
    # Olga runs acme's fleet and keeps its credentials, but does not administer IAM as an admin does.
    api = plane.compute.api
    keeper = await IamGroups(api).roles.create(
        plane.root,
        CreateRoleInput(
            tenant=acme.tenant,
            name="operator-and-keeper",
            actions=("compute:*:*", "iam:*:list", "iam:credentials:*", "iam:principals:disable", "iam:bindings:delete"),
        ),
    )
    olga, olga_key, _ = await make_user(plane, acme.tenant, "olga", keeper.id)
    admin = acme.alice
    admin_credential = acme.alice_credential_id
    attempts: list[Callable[[], Awaitable[Any]]] = [
        lambda: IamGroups(api).credentials.create(
            olga_key, CreateCredentialInput(tenant=acme.tenant, principal_id=admin, expires_in_seconds=None)
        ),
        lambda: IamGroups(api).credentials.revoke(
            olga_key, RevokeCredentialInput(tenant=acme.tenant, credential_id=admin_credential)
        ),
        lambda: IamGroups(api).bindings.delete(
            olga_key, DeleteBindingInput(tenant=acme.tenant, binding_id=acme.alice_binding)
        ),
        lambda: IamGroups(api).principals.disable(
            olga_key, DisablePrincipalInput(tenant=acme.tenant, principal_id=admin)
        ),
    ]
    for attempt in attempts:
        with pytest.raises(AccessDeniedError) as info:
            await attempt()
        assert info.value.details["missing"] == ["iam:*:*"]
    assert (await api.system.whoami(acme.alice_credential, WhoamiInput())).principal_id == admin

    # She acts on a viewer (who holds less) and on herself; the admin acts on her.
    viewer, _, viewer_binding = await make_user(plane, acme.tenant, "vera", "compute.viewer")
    minted = await IamGroups(api).credentials.create(
        olga_key, CreateCredentialInput(tenant=acme.tenant, principal_id=viewer, expires_in_seconds=None)
    )
    await IamGroups(api).credentials.revoke(
        olga_key, RevokeCredentialInput(tenant=acme.tenant, credential_id=minted.id)
    )
    await IamGroups(api).bindings.delete(olga_key, DeleteBindingInput(tenant=acme.tenant, binding_id=viewer_binding))
    await IamGroups(api).principals.disable(olga_key, DisablePrincipalInput(tenant=acme.tenant, principal_id=viewer))
    own = await IamGroups(api).credentials.create(
        olga_key, CreateCredentialInput(tenant=acme.tenant, principal_id=olga, expires_in_seconds=3600)
    )
    await IamGroups(api).credentials.revoke(olga_key, RevokeCredentialInput(tenant=acme.tenant, credential_id=own.id))
    await IamGroups(api).principals.disable(
        acme.alice_credential, DisablePrincipalInput(tenant=acme.tenant, principal_id=olga)
    )
