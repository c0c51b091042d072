"""Every IAM method's happy path, over HTTP and through the in-process ``api`` (the same dispatcher)."""

from __future__ import annotations

import re

import pytest

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
from bettercompute_iam._policy import BUILTIN_ROLE_NAMES as BUILTIN_ROLES

from .conftest import Acme, Plane, data, post

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

HEX16 = r"[0-9a-f]{16}"


async def test_the_five_groups_are_registered_with_iam_actions(plane: Plane) -> None:
    groups = {"tenants", "principals", "credentials", "roles", "bindings"}
    actions = {m.action for m in plane.compute.registry.methods() if m.group in groups}
    assert actions == {
        "iam:tenants:create",
        "iam:tenants:list",
        "iam:principals:create",
        "iam:principals:list",
        "iam:principals:disable",
        "iam:credentials:create",
        "iam:credentials:list",
        "iam:credentials:revoke",
        "iam:roles:create",
        "iam:roles:list",
        "iam:bindings:create",
        "iam:bindings:delete",
        "iam:bindings:list",
    }
    assert actions <= set(plane.iam.actions)


async def test_tenants(plane: Plane) -> None:
    created = data(await post(plane, plane.root, "tenants/create", {"name": "acme"}))
    assert re.fullmatch(rf"tn_{HEX16}", created["id"]) and created["name"] == "acme"
    assert created["created_at"].endswith("Z")
    globex = await IamGroups(plane.compute.api).tenants.create(plane.root, CreateTenantInput(name="globex"))
    assert re.fullmatch(rf"tn_{HEX16}", globex.id)

    listed = data(await post(plane, plane.root, "tenants/list", {}))
    assert [t["name"] for t in listed["tenants"]] == ["root", "acme", "globex"]
    assert listed["next_cursor"] is None
    in_process = await IamGroups(plane.compute.api).tenants.list(plane.root, ListTenantsInput())
    assert [t.id for t in in_process.tenants] == [t["id"] for t in listed["tenants"]]


async def test_principals(plane: Plane, acme: Acme) -> None:
    body = {"tenant": acme.tenant, "name": "ci-bot", "kind": "service_account"}
    bot = data(await post(plane, plane.root, "principals/create", body))
    assert re.fullmatch(rf"pr_{HEX16}", bot["id"])
    assert bot["tenant"] == acme.tenant and bot["kind"] == "service_account" and bot["disabled_at"] is None
    bob = await IamGroups(plane.compute.api).principals.create(
        plane.root, CreatePrincipalInput(tenant=acme.tenant, name="bob@acme.example", kind="user")
    )

    listed = data(await post(plane, plane.root, "principals/list", {"tenant": acme.tenant}))
    assert [p["name"] for p in listed["principals"]] == ["alice", "ci-bot", "bob@acme.example"]
    in_process = await IamGroups(plane.compute.api).principals.list(plane.root, ListPrincipalsInput(tenant=acme.tenant))
    assert [p.id for p in in_process.principals] == [acme.alice, bot["id"], bob.id]

    disabled = data(
        await post(plane, plane.root, "principals/disable", {"tenant": acme.tenant, "principal_id": bob.id})
    )
    assert disabled["disabled_at"] is not None
    again = await IamGroups(plane.compute.api).principals.disable(
        plane.root, DisablePrincipalInput(tenant=acme.tenant, principal_id=bob.id)
    )
    assert (
        again.disabled_at is not None
        and again.disabled_at.isoformat().replace("+00:00", "Z") == disabled["disabled_at"]
    )


async def test_credentials(plane: Plane, acme: Acme) -> None:
    body = {"tenant": acme.tenant, "principal_id": acme.alice, "expires_in_seconds": 3600, "description": "laptop"}
    created = data(await post(plane, plane.root, "credentials/create", body))
    assert re.fullmatch(HEX16, created["id"])
    assert created["credential"].startswith(f"bcak_{created['id']}.")
    assert created["expires_at"] is not None and created["principal_id"] == acme.alice
    forever = await IamGroups(plane.compute.api).credentials.create(
        plane.root, CreateCredentialInput(tenant=acme.tenant, principal_id=acme.alice, expires_in_seconds=None)
    )
    assert forever.expires_at is None
    assert forever.credential not in repr(forever)

    listed = data(await post(plane, plane.root, "credentials/list", {"tenant": acme.tenant}))
    assert [c["id"] for c in listed["credentials"]] == [acme.alice_credential_id, created["id"], forever.id]
    assert {c["state"] for c in listed["credentials"]} == {"active"}
    assert listed["credentials"][1]["description"] == "laptop"
    only_alice = await IamGroups(plane.compute.api).credentials.list(
        plane.root, ListCredentialsInput(tenant=acme.tenant, principal_id=acme.alice)
    )
    assert len(only_alice.credentials) == 3

    revoked = data(
        await post(plane, plane.root, "credentials/revoke", {"tenant": acme.tenant, "credential_id": created["id"]})
    )
    assert revoked["state"] == "revoked" and revoked["revoked_at"] is not None
    info = await IamGroups(plane.compute.api).credentials.revoke(
        plane.root, RevokeCredentialInput(tenant=acme.tenant, credential_id=forever.id)
    )
    assert info.state == "revoked"


async def test_roles(plane: Plane, acme: Acme) -> None:
    body = {"tenant": acme.tenant, "name": "reservations-user", "actions": ["compute:system:*", "iam:principals:list"]}
    role = data(await post(plane, plane.root, "roles/create", body))
    assert re.fullmatch(rf"ro_{HEX16}", role["id"])
    assert role["tenant"] == acme.tenant and role["builtin"] is False
    assert role["actions"] == ["compute:system:*", "iam:principals:list"]
    other = await IamGroups(plane.compute.api).roles.create(
        plane.root,
        CreateRoleInput(tenant=acme.tenant, name="readers", actions=("iam:*:list",), description="read IAM"),
    )
    assert other.description == "read IAM"

    listed = data(await post(plane, plane.root, "roles/list", {"tenant": acme.tenant}))
    names = [r["name"] for r in listed["roles"]]
    builtin = len(BUILTIN_ROLES)
    assert sorted(names[:builtin]) == sorted(BUILTIN_ROLES)
    assert names[builtin:] == ["reservations-user", "readers"]
    assert all(r["builtin"] for r in listed["roles"][:builtin])
    in_other_tenant = await IamGroups(plane.compute.api).roles.list(
        plane.root, ListRolesInput(tenant=acme.other_tenant)
    )
    assert [r.name for r in in_other_tenant.roles if not r.builtin] == []


async def test_bindings(plane: Plane, acme: Acme) -> None:
    bob = await IamGroups(plane.compute.api).principals.create(
        plane.root, CreatePrincipalInput(tenant=acme.tenant, name="bob", kind="user")
    )
    body = {"tenant": acme.tenant, "principal_id": bob.id, "role": "compute.viewer", "scope_type": "tenant"}
    viewer = data(await post(plane, plane.root, "bindings/create", body))
    assert re.fullmatch(rf"bd_{HEX16}", viewer["id"])
    assert viewer["scope_id"] == acme.tenant and viewer["role"] == viewer["role_name"] == "compute.viewer"
    role = await IamGroups(plane.compute.api).roles.create(
        plane.root, CreateRoleInput(tenant=acme.tenant, name="gpu-users", actions=("compute:system:*",))
    )
    pool = await IamGroups(plane.compute.api).bindings.create(
        plane.root,
        CreateBindingInput(
            tenant=acme.tenant, principal_id=bob.id, role=role.id, scope_type="pool", scope_id="pool-a100"
        ),
    )
    assert pool.role == role.id and pool.role_name == "gpu-users" and pool.scope_id == "pool-a100"

    listed = data(await post(plane, plane.root, "bindings/list", {"tenant": acme.tenant, "principal_id": bob.id}))
    assert [b["id"] for b in listed["bindings"]] == [viewer["id"], pool.id]
    everyone = await IamGroups(plane.compute.api).bindings.list(plane.root, ListBindingsInput(tenant=acme.tenant))
    assert [b.id for b in everyone.bindings] == [acme.alice_binding, viewer["id"], pool.id]

    deleted = data(await post(plane, plane.root, "bindings/delete", {"tenant": acme.tenant, "binding_id": pool.id}))
    assert deleted == {"deleted": True}
    gone = await IamGroups(plane.compute.api).bindings.delete(
        plane.root, DeleteBindingInput(tenant=acme.tenant, binding_id=viewer["id"])
    )
    assert gone.deleted
    left = await IamGroups(plane.compute.api).bindings.list(
        plane.root, ListBindingsInput(tenant=acme.tenant, principal_id=bob.id)
    )
    assert left.bindings == ()
