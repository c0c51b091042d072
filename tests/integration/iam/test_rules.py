"""Each refusal of IAM's methods: CONFLICT, NOT_FOUND, INVALID_INPUT (with the field's path), ACCESS_DENIED and the
FAILED_PRECONDITION lockout guards."""

from __future__ import annotations

import pytest

from bettercompute.errors import FailedPreconditionError
from bettercompute_iam import (
    CreateBindingInput,
    CreateCredentialInput,
    CreatePrincipalInput,
    CreateRoleInput,
    DisablePrincipalInput,
    IamGroups,
    ListBindingsInput,
)

from .conftest import Acme, Plane, data, error, make_user, post

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

ROOT = "root"


async def root_admin_id(plane: Plane) -> str:
    whoami = data(await post(plane, plane.root, "system/whoami", {}))
    principal_id: str = whoami["principal_id"]
    return principal_id


# --- tenants ----------------------------------------------------------------------------------------------------


async def test_a_tenant_name_is_unique(plane: Plane, acme: Acme) -> None:
    body = error(await post(plane, plane.root, "tenants/create", {"name": "acme"}), 409, "CONFLICT")
    assert body["details"]["path"] == "name"
    error(await post(plane, plane.root, "tenants/create", {"name": "root"}), 409, "CONFLICT")


@pytest.mark.parametrize("name", ["Acme", "", "-acme", "acme-", "a_b", "a" * 64, "acme.corp"])
async def test_a_tenant_name_is_a_lowercase_dns_label(plane: Plane, name: str) -> None:
    body = error(await post(plane, plane.root, "tenants/create", {"name": name}), 400, "INVALID_INPUT")
    assert body["details"]["path"] == "name"
    assert "DNS label" in body["message"]


async def test_the_longest_dns_label_is_accepted(plane: Plane) -> None:
    assert data(await post(plane, plane.root, "tenants/create", {"name": "a" * 63}))["name"] == "a" * 63


# --- principals -------------------------------------------------------------------------------------------------


async def test_a_principal_needs_an_existing_tenant(plane: Plane) -> None:
    body = {"tenant": "tn_0000000000000000", "name": "ghost", "kind": "user"}
    error(await post(plane, plane.root, "principals/create", body), 404, "NOT_FOUND")


async def test_a_principal_name_is_unique_in_its_tenant_only(plane: Plane, acme: Acme) -> None:
    body = {"tenant": acme.tenant, "name": "alice", "kind": "user"}
    error(await post(plane, plane.root, "principals/create", body), 409, "CONFLICT")
    data(await post(plane, plane.root, "principals/create", {**body, "tenant": acme.other_tenant}))


@pytest.mark.parametrize(
    ("field", "value"), [("kind", "robot"), ("name", "Alice"), ("name", ""), ("name", "a b"), ("tenant", "")]
)
async def test_principal_fields_are_checked(plane: Plane, acme: Acme, field: str, value: str) -> None:
    body = {"tenant": acme.tenant, "name": "zed", "kind": "user", field: value}
    found = error(await post(plane, plane.root, "principals/create", body), 400, "INVALID_INPUT")
    assert found["details"]["path"] == field


async def test_a_principal_cannot_disable_itself(plane: Plane, acme: Acme) -> None:
    body = {"tenant": acme.tenant, "principal_id": acme.alice}
    found = error(await post(plane, acme.alice_credential, "principals/disable", body), 409, "FAILED_PRECONDITION")
    assert "lockout" in found["message"]
    root_id = await root_admin_id(plane)
    error(
        await post(plane, plane.root, "principals/disable", {"tenant": ROOT, "principal_id": root_id}),
        409,
        "FAILED_PRECONDITION",
    )


async def test_the_last_root_admin_cannot_be_disabled_by_anyone(plane: Plane) -> None:
    # ops holds everything on the root scope through a custom role (so it is no compute.admin itself), and may
    # disable anyone, but not the only enabled root administrator.
    actions = ["compute:*:*", "iam:*:*"]
    role = data(await post(plane, plane.root, "roles/create", {"tenant": ROOT, "name": "disabler", "actions": actions}))
    ops = data(await post(plane, plane.root, "principals/create", {"tenant": ROOT, "name": "ops", "kind": "user"}))
    binding = {"tenant": ROOT, "principal_id": ops["id"], "role": role["id"], "scope_type": "root"}
    data(await post(plane, plane.root, "bindings/create", binding))
    key = await IamGroups(plane.compute.api).credentials.create(
        plane.root, CreateCredentialInput(tenant=ROOT, principal_id=ops["id"], expires_in_seconds=None)
    )
    root_id = await root_admin_id(plane)
    body = {"tenant": ROOT, "principal_id": root_id}
    found = error(await post(plane, key.credential, "principals/disable", body), 409, "FAILED_PRECONDITION")
    assert "lockout" in found["message"]

    # With a second root administrator, the first may go.
    admin = await IamGroups(plane.compute.api).principals.create(
        plane.root, CreatePrincipalInput(tenant=ROOT, name="second-admin", kind="user")
    )
    await IamGroups(plane.compute.api).bindings.create(
        plane.root, CreateBindingInput(tenant=ROOT, principal_id=admin.id, role="compute.admin", scope_type="root")
    )
    assert data(await post(plane, key.credential, "principals/disable", body))["disabled_at"] is not None


async def test_disabling_a_principal_of_another_tenant_is_not_found(plane: Plane, acme: Acme) -> None:
    body = {"tenant": acme.other_tenant, "principal_id": acme.alice}
    error(await post(plane, plane.root, "principals/disable", body), 404, "NOT_FOUND")
    unknown = {"tenant": acme.tenant, "principal_id": "pr_0000000000000000"}
    error(await post(plane, plane.root, "principals/disable", unknown), 404, "NOT_FOUND")


# --- credentials ------------------------------------------------------------------------------------------------


async def test_a_disabled_principal_gets_no_credential(plane: Plane, acme: Acme) -> None:
    bob = await IamGroups(plane.compute.api).principals.create(
        plane.root, CreatePrincipalInput(tenant=acme.tenant, name="bob", kind="user")
    )
    await IamGroups(plane.compute.api).principals.disable(
        plane.root, DisablePrincipalInput(tenant=acme.tenant, principal_id=bob.id)
    )
    body = {"tenant": acme.tenant, "principal_id": bob.id, "expires_in_seconds": None}
    error(await post(plane, plane.root, "credentials/create", body), 409, "FAILED_PRECONDITION")
    with pytest.raises(FailedPreconditionError):
        await IamGroups(plane.compute.api).credentials.create(
            plane.root, CreateCredentialInput(tenant=acme.tenant, principal_id=bob.id, expires_in_seconds=None)
        )


@pytest.mark.parametrize("seconds", [0, 59, 10 * 366 * 24 * 3600 + 1, -60])
async def test_a_credential_lives_from_a_minute_to_ten_years(plane: Plane, acme: Acme, seconds: int) -> None:
    body = {"tenant": acme.tenant, "principal_id": acme.alice, "expires_in_seconds": seconds}
    found = error(await post(plane, plane.root, "credentials/create", body), 400, "INVALID_INPUT")
    assert found["details"]["path"] == "expires_in_seconds"


async def test_a_credential_says_when_it_expires(plane: Plane, acme: Acme) -> None:
    # Leaving expires_in_seconds out is not "never": never is an explicit null.
    body = {"tenant": acme.tenant, "principal_id": acme.alice}
    found = error(await post(plane, plane.root, "credentials/create", body), 400, "INVALID_INPUT")
    assert found["details"]["path"] == "expires_in_seconds"
    long = {**body, "expires_in_seconds": 10 * 366 * 24 * 3600, "description": "x" * 256}
    assert data(await post(plane, plane.root, "credentials/create", long))["expires_at"] is not None
    too_long = {**long, "description": "x" * 257}
    assert error(await post(plane, plane.root, "credentials/create", too_long), 400, "INVALID_INPUT")["details"][
        "path"
    ] == ("description")


async def test_credentials_of_another_tenant_are_not_found(plane: Plane, acme: Acme) -> None:
    body = {"tenant": acme.other_tenant, "principal_id": acme.alice, "expires_in_seconds": None}
    error(await post(plane, plane.root, "credentials/create", body), 404, "NOT_FOUND")
    revoke = {"tenant": acme.other_tenant, "credential_id": acme.alice_credential_id}
    error(await post(plane, plane.root, "credentials/revoke", revoke), 404, "NOT_FOUND")
    # And alice's credential still works: nothing was revoked.
    assert data(await post(plane, acme.alice_credential, "system/whoami", {}))["principal_id"] == acme.alice
    listed = data(await post(plane, plane.root, "credentials/list", {"tenant": acme.other_tenant}))
    assert listed["credentials"] == []


async def test_revoking_twice_keeps_the_first_time(plane: Plane, acme: Acme) -> None:
    body = {"tenant": acme.tenant, "credential_id": acme.alice_credential_id}
    first = data(await post(plane, plane.root, "credentials/revoke", body))
    second = data(await post(plane, plane.root, "credentials/revoke", body))
    assert first == second and first["state"] == "revoked"


# --- roles ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["compute.admin", "compute.my-role", "Readers", "", "-x"])
async def test_role_names_are_checked_and_compute_is_reserved(plane: Plane, acme: Acme, name: str) -> None:
    body = {"tenant": acme.tenant, "name": name, "actions": ["iam:*:list"]}
    found = error(await post(plane, plane.root, "roles/create", body), 400, "INVALID_INPUT")
    assert found["details"]["path"] == "name"
    if name.startswith("compute."):
        assert "built-in" in found["message"]


async def test_every_bad_pattern_is_listed(plane: Plane, acme: Acme) -> None:
    actions = ["iam:*:list", "compute:*", "Compute:x:y", "compute:nothing:*", "iam:tenants:frobnicate"]
    body = {"tenant": acme.tenant, "name": "typos", "actions": actions}
    found = error(await post(plane, plane.root, "roles/create", body), 400, "INVALID_INPUT")
    assert found["details"]["path"] == "actions"
    assert found["details"]["patterns"] == actions[1:]
    assert len(found["details"]["problems"]) == 4


async def test_a_role_needs_actions(plane: Plane, acme: Acme) -> None:
    body = {"tenant": acme.tenant, "name": "empty", "actions": []}
    assert error(await post(plane, plane.root, "roles/create", body), 400, "INVALID_INPUT")["details"]["path"] == (
        "actions"
    )


async def test_a_role_name_is_unique_in_its_tenant_and_the_tenant_must_exist(plane: Plane, acme: Acme) -> None:
    body = {"tenant": acme.tenant, "name": "readers", "actions": ["iam:*:list"]}
    data(await post(plane, plane.root, "roles/create", body))
    error(await post(plane, plane.root, "roles/create", body), 409, "CONFLICT")
    data(await post(plane, plane.root, "roles/create", {**body, "tenant": acme.other_tenant}))
    error(await post(plane, plane.root, "roles/create", {**body, "tenant": "tn_0000000000000000"}), 404, "NOT_FOUND")


async def test_a_custom_role_grants_exactly_its_actions(plane: Plane, acme: Acme) -> None:
    role = await IamGroups(plane.compute.api).roles.create(
        acme.alice_credential, CreateRoleInput(tenant=acme.tenant, name="lister", actions=("iam:principals:list",))
    )
    _, key, _ = await make_user(plane, acme.tenant, "lena", role.id, by=acme.alice_credential)
    assert data(await post(plane, key, "principals/list", {"tenant": acme.tenant}))["principals"]
    error(await post(plane, key, "credentials/list", {"tenant": acme.tenant}), 403, "ACCESS_DENIED")


# --- bindings ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope_type", "scope_id"),
    [("root", "anything"), ("tenant", "tn_0000000000000000"), ("pool", None), ("pool", ""), ("galaxy", None)],
)
async def test_a_scope_id_must_fit_its_scope(plane: Plane, acme: Acme, scope_type: str, scope_id: str | None) -> None:
    body = {
        "tenant": acme.tenant,
        "principal_id": acme.alice,
        "role": "compute.viewer",
        "scope_type": scope_type,
        "scope_id": scope_id,
    }
    found = error(await post(plane, plane.root, "bindings/create", body), 400, "INVALID_INPUT")
    assert found["details"]["path"] == ("scope_type" if scope_type == "galaxy" else "scope_id")


async def test_a_tenant_scope_may_name_its_tenant(plane: Plane, acme: Acme) -> None:
    body = {"tenant": acme.tenant, "principal_id": acme.alice, "role": "compute.viewer", "scope_type": "tenant"}
    explicit = data(await post(plane, plane.root, "bindings/create", {**body, "scope_id": acme.tenant}))
    assert explicit["scope_id"] == acme.tenant


async def test_bindings_need_a_principal_and_a_role_of_the_tenant(plane: Plane, acme: Acme) -> None:
    other_role = await IamGroups(plane.compute.api).roles.create(
        plane.root, CreateRoleInput(tenant=acme.other_tenant, name="theirs", actions=("iam:*:list",))
    )
    base = {"tenant": acme.tenant, "principal_id": acme.alice, "role": "compute.viewer", "scope_type": "tenant"}
    stranger = {**base, "tenant": acme.other_tenant}
    found = error(await post(plane, plane.root, "bindings/create", stranger), 404, "NOT_FOUND")
    assert found["details"]["path"] == "principal_id"
    for role in (other_role.id, "compute.superuser"):
        found = error(await post(plane, plane.root, "bindings/create", {**base, "role": role}), 404, "NOT_FOUND")
        assert found["details"]["path"] == "role"


async def test_a_binding_is_unique(plane: Plane, acme: Acme) -> None:
    body = {"tenant": acme.tenant, "principal_id": acme.alice, "role": "compute.admin", "scope_type": "tenant"}
    error(await post(plane, plane.root, "bindings/create", body), 409, "CONFLICT")


async def test_only_root_or_the_pool_may_grant_on_a_pool(plane: Plane, acme: Acme) -> None:
    body = {
        "tenant": acme.tenant,
        "principal_id": acme.alice,
        "role": "compute.viewer",
        "scope_type": "pool",
        "scope_id": "pool-a100",
    }
    error(await post(plane, acme.alice_credential, "bindings/create", body), 403, "ACCESS_DENIED")
    data(await post(plane, plane.root, "bindings/create", body))
    # A pool's administrator from another tenant may not reach into acme, although the pool is theirs.
    mallory, key, _ = await make_user(plane, acme.other_tenant, "mallory", "compute.viewer")
    await IamGroups(plane.compute.api).bindings.create(
        plane.root,
        CreateBindingInput(
            tenant=acme.other_tenant,
            principal_id=mallory,
            role="compute.admin",
            scope_type="pool",
            scope_id="pool-a100",
        ),
    )
    error(await post(plane, key, "bindings/create", {**body, "role": "compute.admin"}), 403, "ACCESS_DENIED")
    own = {**body, "tenant": acme.other_tenant, "principal_id": mallory, "role": "compute.member"}
    assert data(await post(plane, key, "bindings/create", own))["scope_id"] == "pool-a100"


async def test_a_root_scope_binding_is_deleted_only_from_the_root_tenant(plane: Plane, acme: Acme) -> None:
    bob = await IamGroups(plane.compute.api).principals.create(
        plane.root, CreatePrincipalInput(tenant=acme.tenant, name="bob", kind="user")
    )
    binding = await IamGroups(plane.compute.api).bindings.create(
        plane.root,
        CreateBindingInput(tenant=acme.tenant, principal_id=bob.id, role="compute.viewer", scope_type="root"),
    )
    body = {"tenant": acme.tenant, "binding_id": binding.id}
    error(await post(plane, acme.alice_credential, "bindings/delete", body), 403, "ACCESS_DENIED")
    assert data(await post(plane, plane.root, "bindings/delete", body)) == {"deleted": True}
    error(await post(plane, plane.root, "bindings/delete", body), 404, "NOT_FOUND")


async def test_the_last_root_admin_binding_cannot_be_deleted(plane: Plane) -> None:
    bindings = await IamGroups(plane.compute.api).bindings.list(plane.root, ListBindingsInput(tenant=ROOT))
    (only,) = bindings.bindings
    assert only.role == "compute.admin" and only.scope_type == "root"
    body = {"tenant": ROOT, "binding_id": only.id}
    found = error(await post(plane, plane.root, "bindings/delete", body), 409, "FAILED_PRECONDITION")
    assert "lockout" in found["message"]
    # A second root administrator who is disabled does not count.
    other = await IamGroups(plane.compute.api).principals.create(
        plane.root, CreatePrincipalInput(tenant=ROOT, name="other-admin", kind="user")
    )
    await IamGroups(plane.compute.api).bindings.create(
        plane.root, CreateBindingInput(tenant=ROOT, principal_id=other.id, role="compute.admin", scope_type="root")
    )
    await IamGroups(plane.compute.api).principals.disable(
        plane.root, DisablePrincipalInput(tenant=ROOT, principal_id=other.id)
    )
    error(await post(plane, plane.root, "bindings/delete", body), 409, "FAILED_PRECONDITION")


async def test_a_binding_of_another_tenant_is_not_found(plane: Plane, acme: Acme) -> None:
    body = {"tenant": acme.other_tenant, "binding_id": acme.alice_binding}
    error(await post(plane, plane.root, "bindings/delete", body), 404, "NOT_FOUND")
    assert data(await post(plane, acme.alice_credential, "system/whoami", {}))
    body = {"tenant": acme.tenant, "binding_id": acme.alice_binding}
    assert data(await post(plane, plane.root, "bindings/delete", body))["deleted"]
    # Her grants are gone at once: the grants cache was cleared.
    error(await post(plane, acme.alice_credential, "principals/list", {"tenant": acme.tenant}), 403, "ACCESS_DENIED")
