"""Every IAM mutation leaves exactly one audit row with its decision's id; no credential secret is stored or listed."""

from __future__ import annotations

import json
import logging

import psycopg
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
    RevokeCredentialInput,
)

from .conftest import Plane, data, error, post

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


def audit_rows(database_url: str, schema: str) -> list[tuple[str, str | None, str | None, str | None, str]]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            f'SELECT action, decision_id, tenant, resource_id, actor FROM "{schema}".audit WHERE action LIKE %s'
            " ORDER BY id",
            ("iam:%",),
        ).fetchall()
    return [tuple(r) for r in rows]


async def test_each_mutation_writes_one_audit_row_with_its_decision(
    plane: Plane, database_url: str, fresh_schema: str
) -> None:
    api, root = plane.compute.api, plane.root
    tenant = await IamGroups(api).tenants.create(root, CreateTenantInput(name="acme"))
    bob = await IamGroups(api).principals.create(root, CreatePrincipalInput(tenant=tenant.id, name="bob", kind="user"))
    key = await IamGroups(api).credentials.create(
        root, CreateCredentialInput(tenant=tenant.id, principal_id=bob.id, expires_in_seconds=None)
    )
    await IamGroups(api).credentials.revoke(root, RevokeCredentialInput(tenant=tenant.id, credential_id=key.id))
    role = await IamGroups(api).roles.create(
        root, CreateRoleInput(tenant=tenant.id, name="readers", actions=("iam:*:list",))
    )
    binding = await IamGroups(api).bindings.create(
        root, CreateBindingInput(tenant=tenant.id, principal_id=bob.id, role=role.id, scope_type="tenant")
    )
    await IamGroups(api).bindings.delete(root, DeleteBindingInput(tenant=tenant.id, binding_id=binding.id))
    await IamGroups(api).principals.disable(root, DisablePrincipalInput(tenant=tenant.id, principal_id=bob.id))
    # Reads and refused mutations leave no row.
    data(await post(plane, root, "principals/list", {"tenant": tenant.id}))
    error(await post(plane, root, "tenants/create", {"name": "acme"}), 409, "CONFLICT")

    rows = audit_rows(database_url, fresh_schema)
    assert [(action, resource) for action, _, _, resource, _ in rows] == [
        ("iam:tenants:create", tenant.id),
        ("iam:principals:create", bob.id),
        ("iam:credentials:create", key.id),
        ("iam:credentials:revoke", key.id),
        ("iam:roles:create", role.id),
        ("iam:bindings:create", binding.id),
        ("iam:bindings:delete", binding.id),
        ("iam:principals:disable", bob.id),
    ]
    decisions = [decision for _, decision, _, _, _ in rows]
    assert all(decisions) and len(set(decisions)) == len(decisions)
    assert {t for _, _, t, _, _ in rows} == {tenant.id}
    whoami = data(await post(plane, root, "system/whoami", {}))
    assert {actor for *_, actor in rows} == {whoami["principal_id"]}


def denied_rows(database_url: str, schema: str) -> list[tuple[str, str, str | None, str | None, str]]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            f'SELECT action, actor, tenant, decision_id, details::text FROM "{schema}".audit'
            " WHERE outcome = 'denied' ORDER BY id"
        ).fetchall()
    return [tuple(r) for r in rows]


async def test_a_refused_mutation_leaves_a_denied_audit_row_and_a_refused_read_none(
    plane: Plane, database_url: str, fresh_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bettercompute.dispatch")
    root = plane.root
    acme = data(await post(plane, root, "tenants/create", {"name": "acme"}))["id"]
    other = data(await post(plane, root, "tenants/create", {"name": "other"}))["id"]
    bob = data(await post(plane, root, "principals/create", {"tenant": acme, "name": "bob", "kind": "user"}))
    body = {"tenant": acme, "principal_id": bob["id"], "expires_in_seconds": None}
    key = data(await post(plane, root, "credentials/create", body))["credential"]
    assert denied_rows(database_url, fresh_schema) == []

    # IAM refuses bob (no bindings) a mutation in his own tenant; the tenant pre-check one in another tenant.
    error(
        await post(plane, key, "roles/create", {"tenant": acme, "name": "r", "actions": ["iam:*:list"]}),
        403,
        "ACCESS_DENIED",
    )
    error(
        await post(plane, key, "principals/create", {"tenant": other, "name": "x", "kind": "user"}),
        403,
        "ACCESS_DENIED",
    )
    # Refused reads are not audited, as reads are not.
    error(await post(plane, key, "principals/list", {"tenant": acme}), 403, "ACCESS_DENIED")
    error(await post(plane, key, "principals/list", {"tenant": other}), 403, "ACCESS_DENIED")

    rows = denied_rows(database_url, fresh_schema)
    assert [(action, actor, tenant, decision) for action, actor, tenant, decision, _ in rows] == [
        ("iam:roles:create", bob["id"], acme, None),
    ]
    assert "not allowed" in rows[0][4]
    # The tenant pre-check refuses without touching the database (so a flood of them costs it nothing): a log line.
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused ")]
    assert refusals == [
        f"refused iam:principals:create to {bob['id']}: outside tenant {other}",
        f"refused iam:principals:list to {bob['id']}: outside tenant {other}",
    ]
    # Nothing of what was refused exists.
    roles = data(await post(plane, root, "roles/list", {"tenant": acme}))["roles"]
    assert [r["name"] for r in roles if r["name"] == "r"] == []


async def test_no_secret_is_stored_or_listed(plane: Plane, database_url: str, fresh_schema: str) -> None:
    tenant = data(await post(plane, plane.root, "tenants/create", {"name": "acme"}))["id"]
    bob = data(await post(plane, plane.root, "principals/create", {"tenant": tenant, "name": "bob", "kind": "user"}))
    credentials = [plane.root]
    for seconds in (None, 3600):
        body = {"tenant": tenant, "principal_id": bob["id"], "expires_in_seconds": seconds, "description": "ci"}
        credentials.append(data(await post(plane, plane.root, "credentials/create", body))["credential"])
    data(await post(plane, credentials[1], "system/whoami", {}))  # a use writes last_used_at
    secrets = [c.split(".", 1)[1] for c in credentials]

    with psycopg.connect(database_url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (fresh_schema,)
        ).fetchall()
        assert len(tables) > 5
        for (table,) in tables:
            dump = "\n".join(r[0] for r in conn.execute(f'SELECT t::text FROM "{fresh_schema}"."{table}" t'))
            assert not any(secret in dump for secret in secrets), table

    for who in ("root", tenant):
        response = await post(plane, plane.root, "credentials/list", {"tenant": who})
        listed = data(response)["credentials"]
        assert listed and all(set(c) == {*_INFO_FIELDS} for c in listed)
        assert not any(secret in response.text for secret in secrets)
    assert "secret" not in json.dumps(data(response)) and "hash" not in json.dumps(data(response))


_INFO_FIELDS = (
    "id",
    "principal_id",
    "description",
    "created_at",
    "expires_at",
    "revoked_at",
    "last_used_at",
    "state",
)


async def test_no_secret_reaches_a_log_line_or_an_error(plane: Plane, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    tenant = data(await post(plane, plane.root, "tenants/create", {"name": "acme"}))["id"]
    bob = data(await post(plane, plane.root, "principals/create", {"tenant": tenant, "name": "bob", "kind": "user"}))
    body = {"tenant": tenant, "principal_id": bob["id"], "expires_in_seconds": None}
    created = data(await post(plane, plane.root, "credentials/create", body))
    credential = created["credential"]
    secret = credential.split(".", 1)[1]
    forged = credential[: -len(secret)] + secret[::-1]
    responses = [
        await post(plane, credential, "system/whoami", {}),
        await post(plane, forged, "system/whoami", {}),  # right id, wrong secret
        await post(plane, credential + "x", "system/whoami", {}),  # malformed
        await post(plane, plane.root, "credentials/revoke", {"tenant": tenant, "credential_id": created["id"]}),
        await post(plane, credential, "system/whoami", {}),  # revoked
    ]
    assert [r.status_code for r in responses] == [200, 401, 401, 200, 401]
    assert caplog.records  # the story did log (so the check below looks at something)
    for text in (caplog.text, *(r.text for r in responses)):
        assert secret not in text and secret[::-1] not in text
        assert plane.root.split(".", 1)[1] not in text
