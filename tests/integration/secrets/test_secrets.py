"""The ``secrets`` group and ``SecretBroker``: values sealed at rest, never returned, released as JWE to entitled
nodes only, every release audited, and no plaintext in any table or log."""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from typing import Any

import attrs
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
from bettercompute.modules.nodes import NODES, CreateJoinTokenInput, NodeIdentity
from bettercompute.modules.pools import POOLS, CreatePoolInput, Pool
from bettercompute.modules.secrets import (
    RELEASE_ACTION,
    SECRETS,
    CreateSecretInput,
    DeleteSecretInput,
    ListSecretsInput,
    SecretRecord,
)
from bettercompute.modules.secrets._service import value_context
from bettercompute.ports import ResourceRef

from ..dump import dump_schema
from .conftest import Vault

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

PLAINTEXT = "pl41ntext-db-password-7f3a9c"


async def _create(vault: Vault, name: str, scope: str, value: str = PLAINTEXT) -> Any:
    return await vault.api.create(
        vault.alice, CreateSecretInput(tenant=vault.acme, name=name, scope=scope, value=value)
    )


async def _pool(vault: Vault, credential: str, tenant: str, name: str) -> str:
    pool: Pool = await vault.compute.api.pools.create(credential, CreatePoolInput(tenant=tenant, name=name))
    return pool.id


async def _node(vault: Vault, credential: str, pool_id: str) -> str:
    """A node of ``pool_id``, enrolled and projected as JoinService does (no daemon needed for the broker)."""
    token = await vault.compute.api.join_tokens.create(credential, CreateJoinTokenInput(pool_id=pool_id))
    pool = await vault.store.repository(POOLS).get(pool_id)
    assert pool is not None
    async with vault.store.transaction() as tx:
        enrolled = await tx.repository(NODES).enroll(
            new_id=f"node_{secrets.token_hex(8)}",
            pool_id=pool_id,
            tenant=pool.tenant,
            hardware_key=secrets.token_hex(16),
            claims={},
            attestation={},
            join_token_id=token.id,
            reclaim=False,
        )
        await tx.project(ResourceRef(type="node", id=enrolled.node.id, tenant=pool.tenant, pool=pool_id))
    return enrolled.node.id


async def _site_secret(vault: Vault, name: str, site: str, value: str) -> None:
    """A site-scoped secret, written through the store: ``secrets.create`` refuses site scopes until sites exist."""
    sealed = await vault.kms.encrypt(value.encode(), context=value_context(vault.acme, name))
    record = SecretRecord(
        id=f"sec_{secrets.token_hex(8)}",
        tenant=vault.acme,
        name=name,
        scope=f"site:{site}",
        description="",
        sealed_value=sealed,
        created_at=dt.datetime.now(dt.UTC),
    )
    async with vault.store.transaction() as tx:
        await tx.repository(SECRETS).create(record)


@pytest.fixture
async def node(vault: Vault) -> NodeIdentity:
    """A real node of a real pool of acme, on site ``st_x`` (no site exists yet; the broker only matches it)."""
    pool_id = await _pool(vault, vault.alice, vault.acme, "gpus")
    return NodeIdentity(node_id=await _node(vault, vault.alice, pool_id), pool_id=pool_id, site_id="st_x")


async def test_create_list_delete_never_return_the_value(vault: Vault, node: NodeIdentity) -> None:
    created = await _create(vault, "db-password", f"pool:{node.pool_id}")
    assert created.name == "db-password" and created.scope == f"pool:{node.pool_id}" and created.tenant == vault.acme
    assert PLAINTEXT not in repr(created)
    assert PLAINTEXT not in repr(CreateSecretInput(tenant=vault.acme, name="n", scope="node:x", value=PLAINTEXT))
    listed = await vault.api.list(vault.alice, ListSecretsInput(tenant=vault.acme))
    assert listed.secrets == (created,)
    response = await vault.http.post(
        "/api/compute/secrets/list", headers={"authorization": f"Bearer {vault.alice}"}, json={"tenant": vault.acme}
    )
    assert response.status_code == 200 and PLAINTEXT not in response.text and "db-password" in response.text
    with pytest.raises(ConflictError):
        await _create(vault, "db-password", f"node:{node.node_id}")
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


async def _secret_rows(vault: Vault, database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{vault.store.schema}".secrets').fetchone()
    assert row is not None
    return int(row[0])


async def test_the_scope_must_name_a_pool_or_node_of_the_secrets_tenant(
    vault: Vault, node: NodeIdentity, database_url: str
) -> None:
    theirs_pool = await _pool(vault, vault.mallory, vault.globex, "theirs")
    theirs_node = await _node(vault, vault.mallory, theirs_pool)
    refused: dict[str, list[str]] = {
        # Another tenant's pool or node, an id of the same form that does not exist, and a site (none exist yet).
        "pool": [f"pool:{theirs_pool}", f"pool:pool_{secrets.token_hex(8)}"],
        "node": [f"node:{theirs_node}", f"node:node_{secrets.token_hex(8)}"],
        "site": ["site:st_x"],
    }
    for kind, scopes in refused.items():
        answers = []
        for scope in scopes:
            response = await vault.http.post(
                "/api/compute/secrets/create",
                headers={"authorization": f"Bearer {vault.alice}"},
                json={"tenant": vault.acme, "name": "s1", "scope": scope, "value": PLAINTEXT},
            )
            answers.append((response.status_code, response.json()))
        assert answers[0] == (
            404,
            {
                "error": {
                    "code": "NOT_FOUND",
                    "message": f"the scope names no {kind} of this tenant",
                    "details": {"path": "scope"},
                    "retryable": False,
                }
            },
        )
        assert all(answer == answers[0] for answer in answers), kind
    assert await _secret_rows(vault, database_url) == 0
    # The owners' scopes are accepted.
    await _create(vault, "by-pool", f"pool:{node.pool_id}")
    await _create(vault, "by-node", f"node:{node.node_id}")
    assert await _secret_rows(vault, database_url) == 2


async def test_the_broker_releases_to_the_node_its_pool_and_its_site_only(vault: Vault, node: NodeIdentity) -> None:
    await _create(vault, "by-node", f"node:{node.node_id}", "value-node")
    await _create(vault, "by-pool", f"pool:{node.pool_id}", "value-pool")
    await _site_secret(vault, "by-site", "st_x", "value-site")
    await _create(vault, "elsewhere", f"pool:{await _pool(vault, vault.alice, vault.acme, 'other')}", "value-other")
    key = ECKey.generate_key("P-256", private=True)
    public = key.as_dict(private=False)
    for name, value in (("by-node", "value-node"), ("by-pool", "value-pool"), ("by-site", "value-site")):
        token = await vault.broker.secret(node, name, public)
        assert token.count(".") == 4 and value not in token
        assert jwe.decrypt_compact(token, key).plaintext == value.encode()
    # Another node of the same pool gets the pool's secret, not the first node's.
    sibling = NodeIdentity(node_id=await _node(vault, vault.alice, node.pool_id), pool_id=node.pool_id)
    assert jwe.decrypt_compact(await vault.broker.secret(sibling, "by-pool", public), key).plaintext == b"value-pool"
    for identity, name in ((sibling, "by-node"), (sibling, "by-site"), (node, "elsewhere"), (node, "missing")):
        with pytest.raises(AccessDeniedError):
            await vault.broker.secret(identity, name, public)
    # The tenant narrows the search: acme's secret is not globex's.
    with pytest.raises(AccessDeniedError):
        await vault.broker.secret(attrs.evolve(node, tenant=vault.globex), "by-node", public)


async def test_the_jwe_opens_only_with_the_requests_private_key(vault: Vault, node: NodeIdentity) -> None:
    await _create(vault, "by-node", f"node:{node.node_id}")
    for key, other in (
        (ECKey.generate_key("P-256", private=True), ECKey.generate_key("P-256", private=True)),
        (OKPKey.generate_key("X25519", private=True), OKPKey.generate_key("X25519", private=True)),
    ):
        token = await vault.broker.secret(node, "by-node", key.as_dict(private=False))
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
async def test_a_bad_ephemeral_key_is_invalid_input(vault: Vault, node: NodeIdentity, jwk: Any) -> None:
    await _create(vault, "by-node", f"node:{node.node_id}")
    with pytest.raises(InvalidInputError):
        await vault.broker.secret(node, "by-node", jwk)


async def test_a_private_jwk_is_refused(vault: Vault, node: NodeIdentity) -> None:
    await _create(vault, "by-node", f"node:{node.node_id}")
    with pytest.raises(InvalidInputError, match="public key only"):
        await vault.broker.secret(node, "by-node", ECKey.generate_key("P-256", private=True).as_dict(private=True))


async def test_one_name_in_two_tenants_for_one_node_is_refused_without_the_tenant(
    vault: Vault, node: NodeIdentity, database_url: str
) -> None:
    await _create(vault, "shared", f"pool:{node.pool_id}", "acme-value")
    # secrets.create no longer lets globex scope a secret to acme's node; rows written before it did may remain.
    with pytest.raises(NotFoundError):
        await vault.api.create(
            vault.mallory,
            CreateSecretInput(tenant=vault.globex, name="shared", scope=f"node:{node.node_id}", value="globex-value"),
        )
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{vault.store.schema}".secrets (id, tenant, name, scope, description, sealed_value)'
            " VALUES ('sec_legacy', %s, 'shared', %s, '', %s)",
            (vault.globex, f"node:{node.node_id}", b"sealed-elsewhere"),
        )
    key = ECKey.generate_key("P-256", private=True)
    with pytest.raises(FailedPreconditionError):
        await vault.broker.secret(attrs.evolve(node, tenant=None), "shared", key.as_dict(private=False))
    scoped = attrs.evolve(node, tenant=vault.acme)
    token = await vault.broker.secret(scoped, "shared", key.as_dict(private=False))
    assert jwe.decrypt_compact(token, key).plaintext == b"acme-value"


async def test_every_release_and_refusal_is_audited_and_no_plaintext_is_stored_or_logged(
    vault: Vault, node: NodeIdentity, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await _create(vault, "by-node", f"node:{node.node_id}")
    key = ECKey.generate_key("P-256", private=True)
    await vault.broker.secret(node, "by-node", key.as_dict(private=False))
    with pytest.raises(AccessDeniedError):
        await vault.broker.secret(NodeIdentity(node_id="nd_9", pool_id="pl_z"), "by-node", key.as_dict(private=False))
    response = await vault.http.post(
        "/api/compute/secrets/create",
        headers={"authorization": f"Bearer {vault.alice}"},
        json={"tenant": vault.acme, "name": "over-http", "scope": f"pool:{node.pool_id}", "value": PLAINTEXT},
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
    assert rows[1][2] == vault.acme and rows[1][3] == f"node:{node.node_id}" and "by-node" in rows[1][4]
    dump = dump_schema(database_url, schema)
    assert PLAINTEXT not in dump and PLAINTEXT.encode().hex() not in dump
    assert str(key.as_dict(private=True)["d"]) not in dump
    logged = "\n".join(f"{r.getMessage()} {r.args!r}" for r in caplog.records)
    assert PLAINTEXT not in logged and caplog.records  # the broker logs each answer
