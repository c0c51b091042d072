"""A module whose option is not set says which one, on every path, and writes nothing: webhooks and secrets without
``Options.kms``; node identity (revoke, retire, tunnels, the gateway services) without ``Options.join`` and
``Options.kms``. The groups stay registered, so a caller learns what the deployment lacks instead of a 404 that
reads like a typo."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from bettercompute import JoinSettings
from bettercompute.errors import FailedPreconditionError, NotFoundError
from bettercompute.modules.nodes import NODE, NODES, RetireNodeInput, RevokeNodeInput, TunnelNodeInput
from bettercompute.modules.pools import CreatePoolInput, PoolsGroup
from bettercompute.modules.secrets import CreateSecretInput
from bettercompute.modules.webhooks import CreateWebhookInput
from bettercompute.ports import ResourceRef

from ..iam.conftest import TwoTenants, auth, two_tenants

pytestmark = pytest.mark.anyio

JOIN = JoinSettings(gateway_address="gw.example.com:443", trust_domain="example.com")


def _rows(url: str, schema: str, table: str) -> int:
    with psycopg.connect(url) as conn:
        found = conn.execute(f'SELECT count(*) FROM "{schema}"."{table}"').fetchone()
    assert found is not None
    return int(found[0])


async def _node(t: TwoTenants) -> str:
    """A node of acme's pool, written as a join writes it (there is no JoinService here to join one)."""
    pool = await t.compute.api.group(PoolsGroup).create(t.alice, CreatePoolInput(tenant=t.acme, name="gpus"))
    async with t.store.transaction() as tx:
        enrolled = await tx.repository(NODES).enroll(
            new_id="node_missing_options",
            pool_id=pool.id,
            tenant=t.acme,
            hardware_key="hk",
            claims={},
            attestation={},
            join_token_id="jt_x",
            reclaim=False,
        )
        await tx.project(ResourceRef(type=NODE, id=enrolled.node.id, tenant=t.acme, pool=pool.id))
    return enrolled.node.id


@pytest.mark.parametrize(
    ("group", "body", "table"),
    [
        ("webhooks", {"tenant": "TENANT", "url": "https://example.com/hook"}, "webhook_subscriptions"),
        ("secrets", {"tenant": "TENANT", "name": "db", "value": "s3cret", "scope": "pool:p"}, "secrets"),
    ],
)
async def test_without_a_kms_webhooks_and_secrets_say_they_need_one_and_write_nothing(
    database_url: str, empty_schema: str, group: str, body: dict[str, Any], table: str
) -> None:
    async with two_tenants(database_url, empty_schema) as t:
        body = {k: (t.acme if v == "TENANT" else v) for k, v in body.items()}
        answer = await t.http.post(f"/api/compute/{group}/create", headers=auth(t.alice), json=body)
        assert answer.status_code == 409, answer.text
        error = answer.json()["error"]
        assert error["code"] == "FAILED_PRECONDITION"
        assert "Options.kms" in error["message"] and error["details"] == {"group": group}
        # Authentication still comes first: an anonymous caller learns nothing about the deployment.
        anonymous = await t.http.post(f"/api/compute/{group}/create", json=body)
        assert anonymous.json()["error"]["code"] == "UNAUTHENTICATED"
        assert _rows(database_url, empty_schema, table) == 0


async def test_without_a_kms_the_typed_api_raises_the_same(database_url: str, empty_schema: str) -> None:
    async with two_tenants(database_url, empty_schema) as t:
        with pytest.raises(FailedPreconditionError, match=r"Options\.kms"):
            await t.compute.api.webhooks.create(
                t.alice, CreateWebhookInput(tenant=t.acme, url="https://example.com/hook")
            )
        with pytest.raises(FailedPreconditionError, match=r"Options\.kms"):
            await t.compute.api.secrets.create(
                t.alice, CreateSecretInput(tenant=t.acme, name="db", value="s3cret", scope="pool:p")
            )


@pytest.mark.parametrize("options", [{}, {"join": JOIN}], ids=["nothing", "join-without-kms"])
async def test_without_node_identity_what_needs_it_says_both_options(
    database_url: str, empty_schema: str, options: dict[str, Any]
) -> None:
    async with two_tenants(database_url, empty_schema, **options) as t:
        with pytest.raises(FailedPreconditionError, match=r"needs Options\.join and Options\.kms") as services:
            _ = t.compute.gateway_services
        assert services.value.details == {"needs": ["join", "kms"]}
        # Reads work (there is simply no node), and an unknown node is still NOT_FOUND for the calls that need one.
        listed = await t.http.post("/api/compute/nodes/list", headers=auth(t.alice), json={"tenant": t.acme})
        assert listed.status_code == 200 and listed.json()["data"]["nodes"] == []
        with pytest.raises(NotFoundError):
            await t.compute.api.nodes.revoke(t.alice, RevokeNodeInput(id="node_nowhere"))
        # A node that exists (joined while identity was on, say) is neither revoked nor retired without its CA, and
        # no tunnel opens to it.
        node_id = await _node(t)
        for call in (
            t.compute.api.nodes.revoke(t.alice, RevokeNodeInput(id=node_id)),
            t.compute.api.nodes.retire(t.alice, RetireNodeInput(id=node_id)),
            t.compute.api.nodes.tunnel(t.alice, TunnelNodeInput(node_id=node_id, port=22)),
        ):
            with pytest.raises(FailedPreconditionError, match=r"Options\.join and Options\.kms"):
                await call
        still = await t.store.repository(NODES).get(node_id)
        assert still is not None and still.state == "adopting"
        assert _rows(database_url, empty_schema, "tunnels") == 0
