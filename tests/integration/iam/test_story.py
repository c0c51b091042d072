"""The story of a tenant administrator, each step through HTTP with the credential of whoever acts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from bettercompute_iam import CreateCredentialInput, CreatePrincipalInput, IamGroups

from .conftest import Plane, data, error, make_user, post

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@contextmanager
def counted_statements(plane: Plane) -> Iterator[list[str]]:
    """One entry per database access while the block runs: every access, by any path, checks a connection out."""
    statements: list[str] = []
    before = plane.store.pool_usage.checkouts
    try:
        yield statements
    finally:
        statements.extend(["checkout"] * (plane.store.pool_usage.checkouts - before))


async def test_a_tenant_admin_manages_her_tenant_and_nothing_else(plane: Plane, fresh_schema: str) -> None:
    root = plane.root
    acme = data(await post(plane, root, "tenants/create", {"name": "acme"}))["id"]
    globex = data(await post(plane, root, "tenants/create", {"name": "globex"}))["id"]
    alice = data(await post(plane, root, "principals/create", {"tenant": acme, "name": "alice", "kind": "user"}))["id"]
    data(
        await post(
            plane,
            root,
            "bindings/create",
            {"tenant": acme, "principal_id": alice, "role": "compute.admin", "scope_type": "tenant"},
        )
    )
    created = data(
        await post(
            plane, root, "credentials/create", {"tenant": acme, "principal_id": alice, "expires_in_seconds": None}
        )
    )
    alice_key = created["credential"]

    # Alice administers acme with her own credential.
    bob = data(await post(plane, alice_key, "principals/create", {"tenant": acme, "name": "bob", "kind": "user"}))
    assert bob["tenant"] == acme
    whoami = data(await post(plane, alice_key, "system/whoami", {}))
    assert whoami["principal_id"] == alice and whoami["tenant_id"] == acme and not whoami["is_root"]

    # Another tenant is refused by the core's pre-check, without a single database statement (alice is cached).
    with counted_statements(plane) as statements:
        denied = await post(plane, alice_key, "principals/create", {"tenant": globex, "name": "mole", "kind": "user"})
    error(denied, 403, "ACCESS_DENIED")
    assert statements == []
    # The control: the same call on her own tenant does reach the database, so the counter does count.
    with counted_statements(plane) as statements:
        data(await post(plane, alice_key, "principals/list", {"tenant": acme}))
    assert statements

    # Neither the root scope nor tenants are hers to give or make.
    root_binding = {"tenant": acme, "principal_id": bob["id"], "role": "compute.admin", "scope_type": "root"}
    error(await post(plane, alice_key, "bindings/create", root_binding), 403, "ACCESS_DENIED")
    error(await post(plane, alice_key, "tenants/create", {"name": "alice-corp"}), 403, "ACCESS_DENIED")
    error(await post(plane, alice_key, "tenants/list", {}), 403, "ACCESS_DENIED")

    # A viewer may list but not create.
    carol, carol_key, _ = await make_user(plane, acme, "carol", "compute.viewer", by=alice_key)
    listed = data(await post(plane, carol_key, "principals/list", {"tenant": acme}))
    assert {p["name"] for p in listed["principals"]} == {"alice", "bob", "carol"}
    assert data(await post(plane, carol_key, "credentials/list", {"tenant": acme}))["credentials"]
    error(
        await post(plane, carol_key, "principals/create", {"tenant": acme, "name": "dave", "kind": "user"}),
        403,
        "ACCESS_DENIED",
    )

    # Revoking alice's credential stops it at once, although it sits in the authentication cache.
    revoked = await post(plane, root, "credentials/revoke", {"tenant": acme, "credential_id": created["id"]})
    assert data(revoked)["state"] == "revoked"
    error(await post(plane, alice_key, "system/whoami", {}), 401, "UNAUTHENTICATED")

    # Disabling carol stops her credential at once too.
    assert data(await post(plane, carol_key, "system/whoami", {}))["principal_id"] == carol
    disabled = await post(plane, root, "principals/disable", {"tenant": acme, "principal_id": carol})
    assert data(disabled)["disabled_at"] is not None
    error(await post(plane, carol_key, "principals/list", {"tenant": acme}), 401, "UNAUTHENTICATED")


async def test_an_expired_credential_is_refused(plane: Plane) -> None:
    api = plane.compute.api
    acme = data(await post(plane, plane.root, "tenants/create", {"name": "acme"}))["id"]
    erin = await IamGroups(api).principals.create(
        plane.root, CreatePrincipalInput(tenant=acme, name="erin", kind="user")
    )
    created = await IamGroups(api).credentials.create(
        plane.root, CreateCredentialInput(tenant=acme, principal_id=erin.id, expires_in_seconds=60)
    )
    assert created.expires_at is not None
    assert 55 <= (created.expires_at - created.created_at).total_seconds() <= 65
    assert data(await post(plane, created.credential, "system/whoami", {}))["principal_id"] == erin.id

    move_back = (
        f"UPDATE \"{plane.store.schema}\".iam_credentials SET expires_at = now() - interval '1 second' WHERE id = %s"
    )
    async with plane.store.connection() as conn:
        await conn.execute(move_back, (created.id,))
    # Another process would stop trusting its cached copy within the cache's time; this one forgets it now.
    plane.compute.caches.invalidate_all()
    error(await post(plane, created.credential, "system/whoami", {}), 401, "UNAUTHENTICATED")
    listed = data(await post(plane, plane.root, "credentials/list", {"tenant": acme, "principal_id": erin.id}))
    assert [c["state"] for c in listed["credentials"]] == ["expired"]
