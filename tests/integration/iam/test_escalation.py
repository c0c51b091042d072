"""Nobody hands out more than they hold on the scope of the binding (as Kubernetes RBAC's escalation check)."""

from __future__ import annotations

import pytest

from bettercompute.errors import AccessDeniedError
from bettercompute_iam import CreateBindingInput, CreateRoleInput

from ..conftest import Plane
from .conftest import Acme, make_user

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def test_a_binder_cannot_give_a_role_beyond_her_own(plane: Plane, acme: Acme) -> None:
    api = plane.compute.api
    # Carol may create bindings in acme and list principals, nothing more.
    binder = await api.roles.create(
        plane.root,
        CreateRoleInput(tenant=acme.tenant, name="binder", actions=("iam:bindings:create", "iam:principals:list")),
    )
    carol, carol_key, _ = await make_user(plane, acme.tenant, "carol", binder.id)
    lister = await api.roles.create(
        plane.root, CreateRoleInput(tenant=acme.tenant, name="lister", actions=("iam:principals:list",))
    )

    with pytest.raises(AccessDeniedError) as info:
        await api.bindings.create(
            carol_key,
            CreateBindingInput(tenant=acme.tenant, principal_id=carol, role="compute.admin", scope_type="tenant"),
        )
    assert "iam:*:*" in info.value.details["missing"]

    # A role within what she holds is hers to give.
    given = await api.bindings.create(
        carol_key, CreateBindingInput(tenant=acme.tenant, principal_id=carol, role=lister.id, scope_type="tenant")
    )
    assert given.role == lister.id


async def test_a_tenant_admin_gives_her_tenant_roles_but_not_the_root_scope(plane: Plane, acme: Acme) -> None:
    api = plane.compute.api
    bob, _, _ = await make_user(plane, acme.tenant, "bob", "compute.viewer")
    promoted = await api.bindings.create(
        acme.alice_credential,
        CreateBindingInput(tenant=acme.tenant, principal_id=bob, role="compute.admin", scope_type="tenant"),
    )
    assert promoted.scope_id == acme.tenant
    with pytest.raises(AccessDeniedError):
        await api.bindings.create(
            acme.alice_credential,
            CreateBindingInput(tenant=acme.tenant, principal_id=bob, role="compute.viewer", scope_type="root"),
        )
    # Root holds everything everywhere, pools included.
    on_pool = await api.bindings.create(
        plane.root,
        CreateBindingInput(
            tenant=acme.tenant, principal_id=bob, role="compute.member", scope_type="pool", scope_id="pl_gpu"
        ),
    )
    assert on_pool.scope_type == "pool"
