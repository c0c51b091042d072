"""Nobody hands out more than they hold on the scope of the binding (as Kubernetes RBAC's escalation check)."""

from __future__ import annotations

import pytest

from bettercompute.errors import AccessDeniedError
from bettercompute_iam import (
    CreateBindingInput,
    CreateCredentialInput,
    CreatePrincipalInput,
    CreateRoleInput,
    DisablePrincipalInput,
    IamGroups,
)

from ..conftest import Plane
from .conftest import Acme, make_user

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def test_a_binder_cannot_give_a_role_beyond_her_own(plane: Plane, acme: Acme) -> None:
    api = plane.compute.api
    # Carol may create bindings in acme and list principals, nothing more.
    binder = await IamGroups(api).roles.create(
        plane.root,
        CreateRoleInput(tenant=acme.tenant, name="binder", actions=("iam:bindings:create", "iam:principals:list")),
    )
    carol, carol_key, _ = await make_user(plane, acme.tenant, "carol", binder.id)
    lister = await IamGroups(api).roles.create(
        plane.root, CreateRoleInput(tenant=acme.tenant, name="lister", actions=("iam:principals:list",))
    )

    with pytest.raises(AccessDeniedError) as info:
        await IamGroups(api).bindings.create(
            carol_key,
            CreateBindingInput(tenant=acme.tenant, principal_id=carol, role="compute.admin", scope_type="tenant"),
        )
    assert "iam:*:*" in info.value.details["missing"]

    # A role within what she holds is hers to give.
    given = await IamGroups(api).bindings.create(
        carol_key, CreateBindingInput(tenant=acme.tenant, principal_id=carol, role=lister.id, scope_type="tenant")
    )
    assert given.role == lister.id


async def test_a_tenant_admin_gives_her_tenant_roles_but_not_the_root_scope(plane: Plane, acme: Acme) -> None:
    api = plane.compute.api
    bob, _, _ = await make_user(plane, acme.tenant, "bob", "compute.viewer")
    promoted = await IamGroups(api).bindings.create(
        acme.alice_credential,
        CreateBindingInput(tenant=acme.tenant, principal_id=bob, role="compute.admin", scope_type="tenant"),
    )
    assert promoted.scope_id == acme.tenant
    with pytest.raises(AccessDeniedError):
        await IamGroups(api).bindings.create(
            acme.alice_credential,
            CreateBindingInput(tenant=acme.tenant, principal_id=bob, role="compute.viewer", scope_type="root"),
        )
    # Root holds everything everywhere, pools included.
    on_pool = await IamGroups(api).bindings.create(
        plane.root,
        CreateBindingInput(
            tenant=acme.tenant, principal_id=bob, role="compute.member", scope_type="pool", scope_id="pl_gpu"
        ),
    )
    assert on_pool.scope_type == "pool"


async def test_a_tenant_admin_cannot_mint_or_disable_for_a_principal_holding_more(plane: Plane, acme: Acme) -> None:
    # A service account living in acme but bound by root on the root scope holds more than acme's admin.
    api = plane.compute.api
    svc = await IamGroups(api).principals.create(
        plane.root, CreatePrincipalInput(tenant=acme.tenant, name="svc", kind="service_account")
    )
    await IamGroups(api).bindings.create(
        plane.root,
        CreateBindingInput(tenant=acme.tenant, principal_id=svc.id, role="compute.operator", scope_type="root"),
    )
    with pytest.raises(AccessDeniedError) as info:
        await IamGroups(api).credentials.create(
            acme.alice_credential,
            CreateCredentialInput(tenant=acme.tenant, principal_id=svc.id, expires_in_seconds=None),
        )
    assert "compute:*:*" in info.value.details["missing"]
    with pytest.raises(AccessDeniedError):
        await IamGroups(api).principals.disable(
            acme.alice_credential, DisablePrincipalInput(tenant=acme.tenant, principal_id=svc.id)
        )
    # Root may; and acme's admin still manages acme's ordinary principals.
    assert (
        await IamGroups(api).credentials.create(
            plane.root, CreateCredentialInput(tenant=acme.tenant, principal_id=svc.id, expires_in_seconds=None)
        )
    ).credential
    bob, _, _ = await make_user(plane, acme.tenant, "bob", "compute.viewer")
    minted = await IamGroups(api).credentials.create(
        acme.alice_credential, CreateCredentialInput(tenant=acme.tenant, principal_id=bob, expires_in_seconds=3600)
    )
    assert minted.credential
