"""The ``secrets`` group and ``SecretBroker``: values sealed at rest, never returned, released as JWE to entitled
nodes only, every release audited, and no plaintext in any table or log."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
from joserfc import jwe
from joserfc.errors import DecodeError
from joserfc.jwk import ECKey, OKPKey

from bettercompute.errors import (
    AccessDeniedError,
    ConflictError,
    FailedPreconditionError,
    InvalidInputError,
    NotFoundError,
)
from bettercompute.modules.secrets import (
    RELEASE_ACTION,
    CreateSecretInput,
    DeleteSecretInput,
    ListSecretsInput,
    NodeIdentity,
)

from ..dump import dump_schema
from .conftest import Vault

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

PLAINTEXT = "pl41ntext-db-password-7f3a9c"
NODE = NodeIdentity(node_id="nd_1", pool_id="pl_a", site_id="st_x")


async def _create(vault: Vault, name: str, scope: str, value: str = PLAINTEXT) -> Any:
    return await vault.api.create(
        vault.alice, CreateSecretInput(tenant=vault.acme, name=name, scope=scope, value=value)
    )


async def test_create_list_delete_never_return_the_value(vault: Vault) -> None:
    created = await _create(vault, "db-password", "pool:pl_a")
    assert created.name == "db-password" and created.scope == "pool:pl_a" and created.tenant == vault.acme
    assert PLAINTEXT not in repr(created)
    assert PLAINTEXT not in repr(CreateSecretInput(tenant=vault.acme, name="n", scope="node:x", value=PLAINTEXT))
    listed = await vault.api.list(vault.alice, ListSecretsInput(tenant=vault.acme))
    assert listed.secrets == (created,)
    response = await vault.http.post(
        "/api/compute/secrets/list", headers={"authorization": f"Bearer {vault.alice}"}, json={"tenant": vault.acme}
    )
    assert response.status_code == 200 and PLAINTEXT not in response.text and "db-password" in response.text
    with pytest.raises(ConflictError):
        await _create(vault, "db-password", "node:nd_1")
    assert (await vault.api.list(vault.mallory, ListSecretsInput(tenant=vault.globex))).secrets == ()
    with pytest.raises(AccessDeniedError):
        await vault.api.list(vault.mallory, ListSecretsInput(tenant=vault.acme))
    with pytest.raises(NotFoundError):
        await vault.api.delete(vault.mallory, DeleteSecretInput(tenant=vault.globex, name="db-password"))
    assert (await vault.api.delete(vault.alice, DeleteSecretInput(tenant=vault.acme, name="db-password"))).deleted
    with pytest.raises(NotFoundError):
        await vault.api.delete(vault.alice, DeleteSecretInput(tenant=vault.acme, name="db-password"))
    assert (await vault.api.list(vault.alice, ListSecretsInput(tenant=vault.acme))).secrets == ()


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"name": "db password", "scope": "pool:a", "value": "v"}, "name"),
        ({"name": "x", "scope": "tenant:a", "value": "v"}, "scope"),
        ({"name": "x", "scope": "pool:", "value": "v"}, "scope"),
        ({"name": "x", "scope": "pool", "value": "v"}, "scope"),
        ({"name": "x", "scope": "pool:a", "value": ""}, "value"),
        ({"name": "x", "scope": "pool:a", "value": "v" * (64 * 1024 + 1)}, "value"),
        ({"name": "x", "scope": "pool:a"}, "value"),
    ],
)
async def test_bad_inputs_are_invalid_input(vault: Vault, body: dict[str, Any], path: str) -> None:
    response = await vault.http.post(
        "/api/compute/secrets/create",
        headers={"authorization": f"Bearer {vault.alice}"},
        json={"tenant": vault.acme, **body},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == path
    assert "v" * 100 not in response.text


async def test_the_broker_releases_to_the_node_its_pool_and_its_site_only(vault: Vault) -> None:
    await _create(vault, "by-node", "node:nd_1", "value-node")
    await _create(vault, "by-pool", "pool:pl_a", "value-pool")
    await _create(vault, "by-site", "site:st_x", "value-site")
    await _create(vault, "elsewhere", "pool:pl_other", "value-other")
    key = ECKey.generate_key("P-256", private=True)
    public = key.as_dict(private=False)
    for name, value in (("by-node", "value-node"), ("by-pool", "value-pool"), ("by-site", "value-site")):
        token = await vault.broker.secret(NODE, name, public)
        assert token.count(".") == 4 and value not in token
        assert jwe.decrypt_compact(token, key).plaintext == value.encode()
    # Another node of the same pool gets the pool's secret, not the first node's.
    sibling = NodeIdentity(node_id="nd_2", pool_id="pl_a")
    assert jwe.decrypt_compact(await vault.broker.secret(sibling, "by-pool", public), key).plaintext == b"value-pool"
    for identity, name in ((sibling, "by-node"), (sibling, "by-site"), (NODE, "elsewhere"), (NODE, "missing")):
        with pytest.raises(AccessDeniedError):
            await vault.broker.secret(identity, name, public)
    # The tenant narrows the search: acme's secret is not globex's.
    with pytest.raises(AccessDeniedError):
        await vault.broker.secret(NodeIdentity(node_id="nd_1", pool_id="pl_a", tenant=vault.globex), "by-node", public)


async def test_the_jwe_opens_only_with_the_requests_private_key(vault: Vault) -> None:
    await _create(vault, "by-node", "node:nd_1")
    for key, other in (
        (ECKey.generate_key("P-256", private=True), ECKey.generate_key("P-256", private=True)),
        (OKPKey.generate_key("X25519", private=True), OKPKey.generate_key("X25519", private=True)),
    ):
        token = await vault.broker.secret(NODE, "by-node", key.as_dict(private=False))
        assert jwe.decrypt_compact(token, key).plaintext == PLAINTEXT.encode()
        with pytest.raises(DecodeError):
            jwe.decrypt_compact(token, other)


@pytest.mark.parametrize(
    "jwk",
    [
        {"kty": "oct", "k": "AAAA"},
        {"kty": "RSA", "n": "AQAB", "e": "AQAB"},
        {"kty": "EC", "crv": "P-256", "x": "AAAA", "y": "AAAA"},
        {"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
        "not a jwk",
    ],
)
async def test_a_bad_ephemeral_key_is_invalid_input(vault: Vault, jwk: Any) -> None:
    await _create(vault, "by-node", "node:nd_1")
    with pytest.raises(InvalidInputError):
        await vault.broker.secret(NODE, "by-node", jwk)


async def test_a_private_jwk_is_refused(vault: Vault) -> None:
    await _create(vault, "by-node", "node:nd_1")
    with pytest.raises(InvalidInputError, match="public key only"):
        await vault.broker.secret(NODE, "by-node", ECKey.generate_key("P-256", private=True).as_dict(private=True))


async def test_one_name_in_two_tenants_for_one_node_is_refused_without_the_tenant(vault: Vault) -> None:
    await _create(vault, "shared", "pool:pl_a", "acme-value")
    await vault.api.create(
        vault.mallory, CreateSecretInput(tenant=vault.globex, name="shared", scope="node:nd_1", value="globex-value")
    )
    key = ECKey.generate_key("P-256", private=True)
    with pytest.raises(FailedPreconditionError):
        await vault.broker.secret(NODE, "shared", key.as_dict(private=False))
    scoped = NodeIdentity(node_id="nd_1", pool_id="pl_a", tenant=vault.acme)
    token = await vault.broker.secret(scoped, "shared", key.as_dict(private=False))
    assert jwe.decrypt_compact(token, key).plaintext == b"acme-value"


async def test_every_release_and_refusal_is_audited_and_no_plaintext_is_stored_or_logged(
    vault: Vault, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await _create(vault, "by-node", "node:nd_1")
    key = ECKey.generate_key("P-256", private=True)
    await vault.broker.secret(NODE, "by-node", key.as_dict(private=False))
    with pytest.raises(AccessDeniedError):
        await vault.broker.secret(NodeIdentity(node_id="nd_9", pool_id="pl_z"), "by-node", key.as_dict(private=False))
    response = await vault.http.post(
        "/api/compute/secrets/create",
        headers={"authorization": f"Bearer {vault.alice}"},
        json={"tenant": vault.acme, "name": "over-http", "scope": "site:st_x", "value": PLAINTEXT},
    )
    assert response.status_code == 200 and PLAINTEXT not in response.text
    await vault.api.delete(vault.alice, DeleteSecretInput(tenant=vault.acme, name="by-node"))
    schema = vault.store.schema
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            f'SELECT action, outcome, tenant, actor, details::text FROM "{schema}".audit'
            " WHERE resource_type = 'secret' ORDER BY id"
        ).fetchall()
    assert [(r[0], r[1]) for r in rows] == [
        ("compute:secrets:create", "ok"),
        (RELEASE_ACTION, "ok"),
        (RELEASE_ACTION, "denied"),
        ("compute:secrets:create", "ok"),
        ("compute:secrets:delete", "ok"),
    ]
    assert rows[1][2] == vault.acme and rows[1][3] == "node:nd_1" and "by-node" in rows[1][4]
    dump = dump_schema(database_url, schema)
    assert PLAINTEXT not in dump and PLAINTEXT.encode().hex() not in dump
    assert str(key.as_dict(private=True)["d"]) not in dump
    logged = "\n".join(f"{r.getMessage()} {r.args!r}" for r in caplog.records)
    assert PLAINTEXT not in logged and caplog.records  # the broker logs each answer
