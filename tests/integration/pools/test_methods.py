"""The ``pools`` and ``join-tokens`` groups: every method, the secret shown once, and every bad input refused."""

from __future__ import annotations

import datetime as dt
from typing import Any

import anyio
import httpx
import psycopg
import pytest

from bettercompute.errors import AccessDeniedError, ConflictError, NotFoundError
from bettercompute.modules.nodes import (
    JOIN_TOKENS,
    CreateJoinTokenInput,
    GetJoinTokenInput,
    JoinExpect,
    ListJoinTokensInput,
    RevokeJoinTokenInput,
    TokenConsumption,
    hash_secret,
    parse_token,
)
from bettercompute.modules.pools import POOLS, CreatePoolInput, GetPoolInput, ListPoolsInput, Pool, UpdatePoolInput

from .conftest import Plane

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def _pool(plane: Plane, name: str = "gpus") -> str:
    pool: Pool = await plane.pools.create(plane.alice, CreatePoolInput(tenant=plane.acme, name=name))
    return pool.id


async def _post(plane: Plane, path: str, body: dict[str, Any]) -> httpx.Response:
    return await plane.http.post(f"/api/compute/{path}", headers={"authorization": f"Bearer {plane.alice}"}, json=body)


# --- pools ------------------------------------------------------------------------------------------------------


async def test_pools_create_list_get_update(plane: Plane) -> None:
    created = await plane.pools.create(
        plane.alice,
        CreatePoolInput(tenant=plane.acme, name="hosts", pool_class="vps-host", labels={"example.com/zone": "a"}),
    )
    assert created.acceptance_checks == ("diag.nvml",) and created.pool_class == "vps-host"
    assert (await plane.pools.get(plane.alice, GetPoolInput(id=created.id))) == created
    listed = await plane.pools.list(plane.alice, ListPoolsInput(tenant=plane.acme))
    assert listed.pools == (created,)
    assert (await plane.pools.list(plane.mallory, ListPoolsInput(tenant=plane.globex))).pools == ()
    updated = await plane.pools.update(
        plane.alice, UpdatePoolInput(id=created.id, name="hosts-2", acceptance_checks=("diag.nvml", "diag.disk"))
    )
    assert updated.name == "hosts-2" and updated.acceptance_checks == ("diag.nvml", "diag.disk")
    assert updated.labels == {"example.com/zone": "a"} and updated.pool_class == "vps-host"
    assert (await plane.pools.update(plane.alice, UpdatePoolInput(id=created.id, labels={}))).labels == {}


async def test_pool_names_are_unique_per_tenant(plane: Plane) -> None:
    first = await _pool(plane, "a")
    await _pool(plane, "b")
    with pytest.raises(ConflictError):
        await _pool(plane, "a")
    with pytest.raises(ConflictError):
        await plane.pools.update(plane.alice, UpdatePoolInput(id=first, name="b"))
    # Another tenant may use the name.
    await plane.pools.create(plane.mallory, CreatePoolInput(tenant=plane.globex, name="a"))


async def test_pools_of_another_tenant_are_refused(plane: Plane) -> None:
    pool_id = await _pool(plane)
    # Addressed by id, another tenant's pool is NOT_FOUND, as an unknown id is (tests/integration/iam_matrix).
    with pytest.raises(NotFoundError):
        await plane.pools.get(plane.mallory, GetPoolInput(id=pool_id))
    with pytest.raises(NotFoundError):
        await plane.pools.update(plane.mallory, UpdatePoolInput(id=pool_id, name="mine"))
    assert (await plane.pools.get(plane.alice, GetPoolInput(id=pool_id))).name == "gpus"
    with pytest.raises(AccessDeniedError):
        await plane.pools.create(plane.mallory, CreatePoolInput(tenant=plane.acme, name="x"))
    with pytest.raises(AccessDeniedError):
        await plane.pools.list(plane.mallory, ListPoolsInput(tenant=plane.acme))


async def test_an_unknown_pool_is_not_found(plane: Plane) -> None:
    # For a root-scope caller and for a tenant's caller alike.
    with pytest.raises(NotFoundError):
        await plane.pools.get(plane.root, GetPoolInput(id="pool_nope"))
    with pytest.raises(NotFoundError):
        await plane.pools.update(plane.root, UpdatePoolInput(id="pool_nope", name="x"))
    with pytest.raises(NotFoundError):
        await plane.pools.get(plane.alice, GetPoolInput(id="pool_nope"))


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"name": "Bad_Name"}, "name"),
        ({"name": "-x"}, "name"),
        ({"name": "x" * 64}, "name"),
        ({"name": "ok", "pool_class": "cpu"}, "pool_class"),
        ({"name": "ok", "acceptance_checks": ["Diag NVML"]}, "acceptance_checks"),
        ({"name": "ok", "acceptance_checks": ["diag.nvml", "diag.nvml"]}, "acceptance_checks"),
        ({"name": "ok", "labels": {"bad key!": "v"}}, "labels"),
        ({"name": "ok", "labels": {"zone": "white space"}}, "labels"),
    ],
)
async def test_bad_pool_input_is_refused_with_its_path(plane: Plane, body: dict[str, Any], path: str) -> None:
    response = await _post(plane, "pools/create", {"tenant": plane.acme, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == path


async def test_pool_mutations_are_audited_and_projected(plane: Plane, database_url: str) -> None:
    pool_id = await _pool(plane)
    await plane.pools.update(plane.alice, UpdatePoolInput(id=pool_id, labels={"rack": "r1"}))
    with psycopg.connect(database_url) as conn:
        schema = plane.store.schema
        rows = conn.execute(
            f'SELECT action, tenant, decision_id FROM "{schema}".audit WHERE resource_id = %s ORDER BY id', (pool_id,)
        ).fetchall()
        projected = conn.execute(
            f'SELECT tenant_id, pool_id FROM "{schema}".authz_resources WHERE resource_type = %s AND resource_id = %s',
            ("pool", pool_id),
        ).fetchone()
    assert [r[0] for r in rows] == ["compute:pools:create", "compute:pools:update"]
    assert all(r[1] == plane.acme and r[2] for r in rows)
    assert projected == (plane.acme, pool_id)


# --- join tokens ------------------------------------------------------------------------------------------------


async def test_create_shows_the_token_once_with_the_join_command(plane: Plane) -> None:
    pool_id = await _pool(plane)
    created = await plane.tokens.create(
        plane.alice,
        CreateJoinTokenInput(
            pool_id=pool_id, uses=3, expires_in_seconds=3600, expect=JoinExpect(gpu_model="H100", gpu_count=8)
        ),
    )
    parsed = parse_token(created.token)
    assert parsed is not None and parsed[0] == created.id and created.token.startswith("bcjt_")
    assert created.uses_left == 3 and created.expect == JoinExpect(gpu_model="H100", gpu_count=8)
    assert created.join_command.startswith("bcd join --token " + created.token)
    assert "--gateway gw.eu-1.example.com:443 --trust-domain example.com" in created.join_command
    assert "--ca-bundle" not in created.join_command  # no KMS here, so no CA and no JoinService key to pin
    assert parsed[1] not in repr(created)
    secret = parsed[1]
    got = await plane.tokens.get(plane.alice, GetJoinTokenInput(id=created.id))
    assert got.state == "active" and got.uses_left == 3 and got.pool_id == pool_id and got.tenant == plane.acme
    listed = await plane.tokens.list(plane.alice, ListJoinTokensInput(pool_id=pool_id))
    assert listed.tokens == (got,)
    for path, body in (("list", {"pool_id": pool_id}), ("get", {"id": created.id})):
        response = await _post(plane, f"join-tokens/{path}", body)
        assert response.status_code == 200
        assert secret not in response.text and hash_secret(secret).hex() not in response.text
        assert "secret" not in response.text


async def test_revoked_expired_and_exhausted_tokens_show_their_state(plane: Plane, database_url: str) -> None:
    pool_id = await _pool(plane)
    made = [await plane.tokens.create(plane.alice, CreateJoinTokenInput(pool_id=pool_id)) for _ in range(3)]
    revoked = await plane.tokens.revoke(plane.alice, RevokeJoinTokenInput(id=made[0].id))
    assert revoked.state == "revoked" and revoked.revoked_at is not None
    again = await plane.tokens.revoke(plane.alice, RevokeJoinTokenInput(id=made[0].id))
    assert again.revoked_at == revoked.revoked_at
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f"UPDATE \"{plane.store.schema}\".join_tokens SET expires_at = now() - interval '1 second' WHERE id = %s",
            (made[1].id,),
        )
    assert (await plane.tokens.get(plane.alice, GetJoinTokenInput(id=made[1].id))).state == "expired"
    parsed = parse_token(made[2].token)
    assert parsed is not None
    assert (await _consume(plane, made[2].id, parsed[1])).outcome == "consumed"
    exhausted = await plane.tokens.get(plane.alice, GetJoinTokenInput(id=made[2].id))
    assert exhausted.state == "exhausted" and exhausted.uses_left == 0


async def test_tokens_of_another_tenants_pool_are_refused(plane: Plane) -> None:
    pool_id = await _pool(plane)
    token = await plane.tokens.create(plane.alice, CreateJoinTokenInput(pool_id=pool_id))
    with pytest.raises(NotFoundError):
        await plane.tokens.create(plane.mallory, CreateJoinTokenInput(pool_id=pool_id))
    with pytest.raises(NotFoundError):
        await plane.tokens.list(plane.mallory, ListJoinTokensInput(pool_id=pool_id))
    with pytest.raises(NotFoundError):
        await plane.tokens.get(plane.mallory, GetJoinTokenInput(id=token.id))
    with pytest.raises(NotFoundError):
        await plane.tokens.revoke(plane.mallory, RevokeJoinTokenInput(id=token.id))
    assert (await plane.tokens.get(plane.alice, GetJoinTokenInput(id=token.id))).state == "active"


async def test_an_unknown_pool_or_token_is_not_found(plane: Plane) -> None:
    with pytest.raises(NotFoundError):
        await plane.tokens.create(plane.root, CreateJoinTokenInput(pool_id="pool_nope"))
    with pytest.raises(NotFoundError):
        await plane.tokens.list(plane.root, ListJoinTokensInput(pool_id="pool_nope"))
    with pytest.raises(NotFoundError):
        await plane.tokens.get(plane.root, GetJoinTokenInput(id="jt_nope"))
    with pytest.raises(NotFoundError):
        await plane.tokens.revoke(plane.root, RevokeJoinTokenInput(id="jt_nope"))


async def test_no_token_is_minted_for_a_pool_whose_tenant_does_not_exist(plane: Plane, database_url: str) -> None:
    # A pool written before creates checked their tenant (pools.create refuses it now), of a tenant never made.
    async with plane.store.transaction() as tx:
        await tx.repository(POOLS).create(
            id="pool_0123456789abcdef",
            tenant="tn_gone",
            name="orphan",
            pool_class="gpu",
            acceptance_checks=(),
            labels={},
        )
    with pytest.raises(NotFoundError) as refused:
        await plane.tokens.create(plane.root, CreateJoinTokenInput(pool_id="pool_0123456789abcdef"))
    assert refused.value.details == {"path": "tenant", "tenant": "tn_gone"}
    with psycopg.connect(database_url) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{plane.store.schema}".join_tokens').fetchone()
    assert row == (0,)


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"uses": 0}, "uses"),
        ({"uses": 10_001}, "uses"),
        ({"uses": "3"}, "uses"),
        ({"expires_in_seconds": 59}, "expires_in_seconds"),
        ({"expires_in_seconds": 30 * 24 * 3600 + 1}, "expires_in_seconds"),
        ({"reclaim": "always"}, "reclaim"),
        ({"expect": {"gpu_count": -1}}, "expect.gpu_count"),
        ({"expect": {"serial": ""}}, "expect.serial"),
        ({"expect": {"cpu": "x"}}, "expect.cpu"),
        ({"pool_id": "no spaces"}, "pool_id"),
    ],
)
async def test_bad_token_input_is_refused_with_its_path(plane: Plane, body: dict[str, Any], path: str) -> None:
    pool_id = await _pool(plane)
    response = await _post(plane, "join-tokens/create", {"pool_id": pool_id, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == path


async def test_no_token_secret_is_in_any_table(plane: Plane, database_url: str) -> None:
    pool_id = await _pool(plane)
    created = await plane.tokens.create(plane.alice, CreateJoinTokenInput(pool_id=pool_id, uses=2))
    await plane.tokens.revoke(plane.alice, RevokeJoinTokenInput(id=created.id))
    parsed = parse_token(created.token)
    assert parsed is not None
    schema = plane.store.schema
    dumped = []
    with psycopg.connect(database_url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
        for (table,) in tables:
            dumped += [row[0] for row in conn.execute(f'SELECT t::text FROM "{schema}"."{table}" AS t').fetchall()]
    text = "\n".join(dumped)
    assert created.id in text  # the dump does see the token's row
    assert parsed[1] not in text and created.token not in text


# --- consume ----------------------------------------------------------------------------------------------------


async def _consume(plane: Plane, token_id: str, secret: str) -> TokenConsumption:
    async with plane.store.transaction() as tx:
        return await tx.repository(JOIN_TOKENS).consume(
            id=token_id, secret_hash=hash_secret(secret), now=plane.compute.context.clock.now()
        )


async def test_consume_checks_the_secret_and_the_state(plane: Plane) -> None:
    pool_id = await _pool(plane)
    created = await plane.tokens.create(plane.alice, CreateJoinTokenInput(pool_id=pool_id, uses=2))
    parsed = parse_token(created.token)
    assert parsed is not None
    assert (await _consume(plane, created.id, "x" * 43)).outcome == "unknown"
    assert (await _consume(plane, "jt_nope", parsed[1])).outcome == "unknown"
    spent = await _consume(plane, created.id, parsed[1])
    assert spent.outcome == "consumed" and spent.token is not None and spent.token.uses_left == 1
    await plane.tokens.revoke(plane.alice, RevokeJoinTokenInput(id=created.id))
    assert (await _consume(plane, created.id, parsed[1])).outcome == "revoked"
    assert (await plane.tokens.get(plane.alice, GetJoinTokenInput(id=created.id))).uses_left == 1


async def test_the_spending_statement_itself_refuses_an_expired_token(plane: Plane) -> None:
    # A join checks the token before it spends a use; a token that expires between that check and the spend must
    # still be refused by the statement that spends it, with its uses untouched.
    pool_id = await _pool(plane)
    created = await plane.tokens.create(plane.alice, CreateJoinTokenInput(pool_id=pool_id, uses=2))
    parsed = parse_token(created.token)
    assert parsed is not None
    for late in (dt.timedelta(0), dt.timedelta(seconds=1)):  # expiry is exclusive: at expires_at it is over
        async with plane.store.transaction() as tx:
            spent = await tx.repository(JOIN_TOKENS).consume(
                id=created.id, secret_hash=hash_secret(parsed[1]), now=created.expires_at + late
            )
        assert spent.outcome == "expired"
    assert (await plane.tokens.get(plane.alice, GetJoinTokenInput(id=created.id))).uses_left == 2


async def test_two_joins_racing_for_the_last_use_one_wins(plane: Plane) -> None:
    pool_id = await _pool(plane)
    for uses, racers in ((1, 2), (3, 12)):
        created = await plane.tokens.create(plane.alice, CreateJoinTokenInput(pool_id=pool_id, uses=uses))
        parsed = parse_token(created.token)
        assert parsed is not None
        outcomes: list[str] = []
        start = anyio.Event()

        async def join(token_id: str, secret: str, start: anyio.Event, outcomes: list[str]) -> None:
            await start.wait()
            async with plane.store.transaction() as tx:  # each racer on its own pooled connection
                result = await tx.repository(JOIN_TOKENS).consume(
                    id=token_id, secret_hash=hash_secret(secret), now=plane.compute.context.clock.now()
                )
                await anyio.sleep(0.05)  # hold the row while the others queue on it
            outcomes.append(result.outcome)

        async with anyio.create_task_group() as tg:
            for _ in range(racers):
                tg.start_soon(join, created.id, parsed[1], start, outcomes)
            await anyio.sleep(0.05)
            start.set()
        assert sorted(outcomes) == sorted(["consumed"] * uses + ["exhausted"] * (racers - uses))
        got = await plane.tokens.get(plane.alice, GetJoinTokenInput(id=created.id))
        assert got.uses_left == 0 and got.state == "exhausted"
