"""Every mutating method of a full control plane, found in its registry: one audit row carrying the decision's id, a
retry with the same idempotency key replays the first answer (or, for an answer holding a one-time secret, says it
was done) without a second change, and the same key with another request is ``CONFLICT``.

The methods come from the registry, not from a list here: a mutating method without a recipe below fails the test,
so a new method cannot skip these checks. A recipe makes what the method needs and returns two different inputs.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import attrs
import pytest

from bettercompute import (
    ApiBinding,
    CallContext,
    GroupSpec,
    Intercepted,
    JoinSettings,
    LocalKeyKms,
    MethodDef,
    Next,
    method,
)
from bettercompute._runtime.codec import encode
from bettercompute._runtime.declarations import StaticModule
from bettercompute.errors import ConflictError, NotFoundError
from bettercompute.modules.capacity import SetQuotaInput
from bettercompute.modules.images import RegisterImageInput
from bettercompute.modules.nodes import (
    NODES,
    CordonNodeInput,
    CreateJoinTokenInput,
    JoinExpect,
    ListKeysInput,
    NodesGroup,
    RequalifyNodeInput,
    RetireKeyInput,
    RetireNodeInput,
    RevokeJoinTokenInput,
    RevokeNodeInput,
    RotateKeyInput,
    StartRewrapInput,
    TunnelNodeInput,
)
from bettercompute.modules.pools import CreatePoolInput, UpdatePoolInput
from bettercompute.modules.reservations import (
    CancelReservationInput,
    CreateReservationInput,
    ExtendReservationInput,
    ReservationsGroup,
)
from bettercompute.modules.secrets import CreateSecretInput, DeleteSecretInput
from bettercompute.modules.webhooks import (
    CreateWebhookInput,
    DeleteWebhookInput,
    RotateWebhookSecretInput,
    WebhookTestInput,
)
from bettercompute.ports import ResourceRef
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

from ..capacity.conftest import seed_fleet
from ..iam.conftest import TwoTenants, two_tenants

pytestmark = pytest.mark.anyio

B = TypeVar("B")

_names = (f"n{i}" for i in itertools.count())


def _name() -> str:
    return f"{next(_names)}-{secrets.token_hex(3)}"


@attrs.frozen(kw_only=True)
class World:
    t: TwoTenants
    url: str = ""

    @property
    def iam(self) -> IamGroups[ApiBinding]:
        return IamGroups(self.t.compute.api)

    async def pool(self) -> str:
        return (
            await self.t.compute.api.pools.create(self.t.root, CreatePoolInput(tenant=self.t.acme, name=_name()))
        ).id

    async def gpu_pool(self) -> str:
        """A pool of one adopted node with 8 GPUs."""
        pool = await self.pool()
        seed_fleet(self.url, self.t.store.schema, tenant=self.t.acme, pool=pool, nodes=1, prefix=f"{pool}-n")
        return pool

    async def reservation(self) -> str:
        group: ReservationsGroup[Any] = self.t.compute.api.group(ReservationsGroup)
        made = await group.create(
            self.t.root,
            CreateReservationInput(tenant=self.t.acme, pool_id=await self.gpu_pool(), gpus=2, duration="PT1H"),
        )
        return str(made.id)

    async def token(self) -> str:
        created = await self.t.compute.api.join_tokens.create(
            self.t.root, CreateJoinTokenInput(pool_id=await self.pool(), expect=JoinExpect())
        )
        return created.id

    async def webhook(self) -> str:
        created = await self.t.compute.api.webhooks.create(
            self.t.root, CreateWebhookInput(tenant=self.t.acme, url=f"https://hooks.example.com/{_name()}")
        )
        return created.webhook.id

    async def secret(self) -> str:
        name, scope = _name(), f"pool:{await self.pool()}"
        await self.t.compute.api.secrets.create(
            self.t.root, CreateSecretInput(tenant=self.t.acme, name=name, scope=scope, value="s3cr3t")
        )
        return name

    async def principal(self) -> str:
        made = await self.iam.principals.create(
            self.t.root, CreatePrincipalInput(tenant=self.t.acme, name=_name(), kind="user")
        )
        return made.id

    async def credential(self) -> str:
        made = await self.iam.credentials.create(
            self.t.root,
            CreateCredentialInput(tenant=self.t.acme, principal_id=await self.principal(), expires_in_seconds=None),
        )
        return made.id

    async def binding(self) -> str:
        made = await self.iam.bindings.create(
            self.t.root,
            CreateBindingInput(
                tenant=self.t.acme, principal_id=await self.principal(), role="compute.viewer", scope_type="tenant"
            ),
        )
        return made.id

    async def node(self) -> str:
        """A node enrolled straight into the store (joining it for real is the joins tests' business)."""
        pool = await self.pool()
        token = await self.t.compute.api.join_tokens.create(
            self.t.root, CreateJoinTokenInput(pool_id=pool, expect=JoinExpect())
        )
        node_id = f"node_{secrets.token_hex(8)}"
        async with self.t.store.transaction() as tx:
            await tx.repository(NODES).enroll(
                new_id=node_id,
                pool_id=pool,
                tenant=self.t.acme,
                hardware_key=secrets.token_hex(16),
                claims={},
                attestation={},
                join_token_id=token.id,
                reclaim=False,
            )
        return node_id


Recipe = Callable[[World], Awaitable[tuple[Any, Any]]]


async def _pools_create(w: World) -> tuple[Any, Any]:
    return CreatePoolInput(tenant=w.t.acme, name=_name()), CreatePoolInput(tenant=w.t.acme, name=_name())


async def _images_register(w: World) -> tuple[Any, Any]:
    def image(name: str) -> RegisterImageInput:
        return RegisterImageInput(
            tenant=w.t.acme, name=name, kind="disk", url=f"https://images.example.com/{name}.img", sha256="b" * 64
        )

    return image(_name()), image(_name())


async def _pools_update(w: World) -> tuple[Any, Any]:
    pool = await w.pool()
    return UpdatePoolInput(id=pool, name=_name()), UpdatePoolInput(id=pool, name=_name())


async def _tokens_create(w: World) -> tuple[Any, Any]:
    pool = await w.pool()
    return CreateJoinTokenInput(pool_id=pool, expect=JoinExpect()), CreateJoinTokenInput(pool_id=pool, uses=2)


async def _tokens_revoke(w: World) -> tuple[Any, Any]:
    return RevokeJoinTokenInput(id=await w.token()), RevokeJoinTokenInput(id=await w.token())


async def _webhooks_create(w: World) -> tuple[Any, Any]:
    return (
        CreateWebhookInput(tenant=w.t.acme, url="https://hooks.example.com/a"),
        CreateWebhookInput(tenant=w.t.acme, url="https://hooks.example.com/b"),
    )


async def _webhooks_delete(w: World) -> tuple[Any, Any]:
    return (
        DeleteWebhookInput(tenant=w.t.acme, id=await w.webhook()),
        DeleteWebhookInput(tenant=w.t.acme, id=await w.webhook()),
    )


async def _webhooks_rotate(w: World) -> tuple[Any, Any]:
    return (
        RotateWebhookSecretInput(tenant=w.t.acme, id=await w.webhook()),
        RotateWebhookSecretInput(tenant=w.t.acme, id=await w.webhook(), overlap_seconds=0),
    )


async def _webhooks_test(w: World) -> tuple[Any, Any]:
    return (
        WebhookTestInput(tenant=w.t.acme, id=await w.webhook()),
        WebhookTestInput(tenant=w.t.acme, id=await w.webhook()),
    )


async def _secrets_create(w: World) -> tuple[Any, Any]:
    scope = f"pool:{await w.pool()}"
    return (
        CreateSecretInput(tenant=w.t.acme, name=_name(), scope=scope, value="one"),
        CreateSecretInput(tenant=w.t.acme, name=_name(), scope=scope, value="one"),
    )


async def _secrets_delete(w: World) -> tuple[Any, Any]:
    return (
        DeleteSecretInput(tenant=w.t.acme, name=await w.secret()),
        DeleteSecretInput(tenant=w.t.acme, name=await w.secret()),
    )


async def _nodes_revoke(w: World) -> tuple[Any, Any]:
    return RevokeNodeInput(id=await w.node(), reason="re-image"), RevokeNodeInput(id=await w.node(), reason="x")


async def _nodes_cordon(w: World) -> tuple[Any, Any]:
    return CordonNodeInput(id=await w.node(), reason="rack work"), CordonNodeInput(id=await w.node())


async def _nodes_tunnel(w: World) -> tuple[Any, Any]:
    node = await w.node()
    return TunnelNodeInput(node_id=node, port=22), TunnelNodeInput(node_id=node, port=23)


async def _nodes_requalify(w: World) -> tuple[Any, Any]:
    return RequalifyNodeInput(id=await w.node()), RequalifyNodeInput(id=await w.node(), reason="new driver")


async def _nodes_retire(w: World) -> tuple[Any, Any]:
    return RetireNodeInput(id=await w.node(), reason="gone"), RetireNodeInput(id=await w.node(), reason="gone")


async def _tenants_create(w: World) -> tuple[Any, Any]:
    return CreateTenantInput(name=_name()), CreateTenantInput(name=_name())


async def _principals_create(w: World) -> tuple[Any, Any]:
    return (
        CreatePrincipalInput(tenant=w.t.acme, name=_name(), kind="user"),
        CreatePrincipalInput(tenant=w.t.acme, name=_name(), kind="service_account"),
    )


async def _principals_disable(w: World) -> tuple[Any, Any]:
    return (
        DisablePrincipalInput(tenant=w.t.acme, principal_id=await w.principal()),
        DisablePrincipalInput(tenant=w.t.acme, principal_id=await w.principal()),
    )


async def _credentials_create(w: World) -> tuple[Any, Any]:
    principal = await w.principal()
    return (
        CreateCredentialInput(tenant=w.t.acme, principal_id=principal, expires_in_seconds=None),
        CreateCredentialInput(tenant=w.t.acme, principal_id=principal, expires_in_seconds=None, description="other"),
    )


async def _reservations_create(w: World) -> tuple[Any, Any]:
    pool = await w.gpu_pool()
    return (
        CreateReservationInput(tenant=w.t.acme, pool_id=pool, gpus=1, duration="PT1H"),
        CreateReservationInput(tenant=w.t.acme, pool_id=pool, gpus=2, duration="PT1H"),
    )


async def _reservations_cancel(w: World) -> tuple[Any, Any]:
    reservation = await w.reservation()
    return CancelReservationInput(id=reservation), CancelReservationInput(id=reservation, reason="not needed")


async def _reservations_extend(w: World) -> tuple[Any, Any]:
    reservation = await w.reservation()
    return ExtendReservationInput(id=reservation, duration="PT1H"), ExtendReservationInput(
        id=reservation, duration="PT2H"
    )


async def _quotas_set(w: World) -> tuple[Any, Any]:
    pool = await w.pool()
    return (
        SetQuotaInput(pool_id=pool, tenant=w.t.globex, max_gpus=4),
        SetQuotaInput(pool_id=pool, tenant=w.t.globex, max_gpus=4, max_gpu_hours_per_month=100.0),
    )


async def _credentials_revoke(w: World) -> tuple[Any, Any]:
    return (
        RevokeCredentialInput(tenant=w.t.acme, credential_id=await w.credential()),
        RevokeCredentialInput(tenant=w.t.acme, credential_id=await w.credential()),
    )


async def _roles_create(w: World) -> tuple[Any, Any]:
    return (
        CreateRoleInput(tenant=w.t.acme, name=_name(), actions=("compute:pools:list",)),
        CreateRoleInput(tenant=w.t.acme, name=_name(), actions=("compute:pools:get",)),
    )


async def _bindings_create(w: World) -> tuple[Any, Any]:
    principal = await w.principal()
    return (
        CreateBindingInput(tenant=w.t.acme, principal_id=principal, role="compute.viewer", scope_type="tenant"),
        CreateBindingInput(tenant=w.t.acme, principal_id=principal, role="compute.member", scope_type="tenant"),
    )


async def _bindings_delete(w: World) -> tuple[Any, Any]:
    return (
        DeleteBindingInput(tenant=w.t.acme, binding_id=await w.binding()),
        DeleteBindingInput(tenant=w.t.acme, binding_id=await w.binding()),
    )


async def _keys_rotate(w: World) -> tuple[Any, Any]:
    return RotateKeyInput(kind="instructions"), RotateKeyInput(kind="join", overlap_seconds=60)


async def _keys_rewrap(w: World) -> tuple[Any, Any]:
    return StartRewrapInput(), StartRewrapInput(columns=("secrets.sealed_secrets",))


async def _keys_retire(w: World) -> tuple[Any, Any]:
    # Two previous instruction keys to retire: each rotation leaves the key before it previous.
    previous = []
    for _ in range(2):
        active = [k for k in (await w.t.compute.api.keys.list(w.t.root, ListKeysInput(kind="instructions"))).keys]
        previous += [k.id for k in active if k.state == "active"]
        await w.t.compute.api.keys.rotate(w.t.root, RotateKeyInput(kind="instructions"))
    return (
        RetireKeyInput(kind="instructions", id=previous[0], force=True),
        RetireKeyInput(kind="instructions", id=previous[1], force=True),
    )


RECIPES: dict[str, Recipe] = {
    "pools.create": _pools_create,
    "pools.update": _pools_update,
    "images.register": _images_register,
    "join-tokens.create": _tokens_create,
    "join-tokens.revoke": _tokens_revoke,
    "quotas.set": _quotas_set,
    "reservations.create": _reservations_create,
    "reservations.cancel": _reservations_cancel,
    "reservations.extend": _reservations_extend,
    "webhooks.create": _webhooks_create,
    "webhooks.delete": _webhooks_delete,
    "webhooks.rotate-secret": _webhooks_rotate,
    "webhooks.test": _webhooks_test,
    "secrets.create": _secrets_create,
    "secrets.delete": _secrets_delete,
    "nodes.revoke": _nodes_revoke,
    "nodes.cordon": _nodes_cordon,
    "nodes.drain": _nodes_cordon,
    "nodes.uncordon": _nodes_cordon,
    "nodes.requalify": _nodes_requalify,
    "nodes.tunnel": _nodes_tunnel,
    "nodes.retire": _nodes_retire,
    "tenants.create": _tenants_create,
    "principals.create": _principals_create,
    "principals.disable": _principals_disable,
    "credentials.create": _credentials_create,
    "credentials.revoke": _credentials_revoke,
    "roles.create": _roles_create,
    "bindings.create": _bindings_create,
    "bindings.delete": _bindings_delete,
    "keys.rotate": _keys_rotate,
    "keys.retire": _keys_retire,
    "keys.rewrap": _keys_rewrap,
}


@pytest.fixture
async def world(database_url: str, fresh_schema: str, tmp_path: Path) -> AsyncIterator[World]:
    join = JoinSettings(gateway_address="gw.example.com:443", trust_domain="compute.example.test")
    async with two_tenants(database_url, fresh_schema, kms=LocalKeyKms(tmp_path / "kms.key"), join=join) as t:
        yield World(t=t, url=database_url)


async def _audit(w: World, action: str) -> list[Any]:
    sql = w.t.store.sql("SELECT id, actor, decision_id, resource_id FROM {s}.audit WHERE action = :a ORDER BY id")
    return await w.t.store.fetch(sql, {"a": action})


async def _call(w: World, method: MethodDef[Any, Any], input: Any, key: str) -> Any:
    spec = w.t.compute.registry.group(method.group)
    assert spec is not None
    return await getattr(w.t.compute.api.group(spec), method.attr)(w.t.root, input, idempotency_key=key)


async def test_the_recipes_cover_every_mutating_method(world: World) -> None:
    registry = world.t.compute.registry
    mutating = {f"{m.group}.{m.name}" for m in registry.methods() if m.mutates}
    assert NodesGroup.name in {g.name for g in registry.groups()}  # the full plane: every module is on
    assert mutating == set(RECIPES), "a mutating method needs a recipe here (audit and idempotency are checked)"


@pytest.mark.parametrize("name", sorted(RECIPES))
async def test_a_mutation_is_audited_once_and_replayed_by_its_key(world: World, name: str) -> None:
    group, _, method_name = name.partition(".")
    method = world.t.compute.registry.method(group, method_name)
    assert method is not None and method.mutates
    first, other = await RECIPES[name](world)
    before = await _audit(world, method.action)
    key = f"key-{secrets.token_hex(8)}"

    answer = await _call(world, method, first, key)
    rows = await _audit(world, method.action)
    assert len(rows) == len(before) + 1
    row = rows[-1]
    assert row.decision_id and row.decision_id not in {r.decision_id for r in before}

    if method.replayable:
        again = await _call(world, method, first, key)
        assert encode(again) == encode(answer)
    else:
        with pytest.raises(ConflictError) as done:
            await _call(world, method, first, key)
        assert done.value.details["reason"] == "already_done" and done.value.details["id"] is not None
    assert len(await _audit(world, method.action)) == len(rows), "a replay changes nothing and audits nothing"

    with pytest.raises(ConflictError) as reused:
        await _call(world, method, other, key)
    assert reused.value.details["reason"] == "idempotency_key_reused"
    assert len(await _audit(world, method.action)) == len(rows)


async def test_concurrent_calls_with_one_key_make_one_change(world: World) -> None:
    key = "burst-1"
    request = CreatePoolInput(tenant=world.t.acme, name="burst")
    api = world.t.compute.api
    before = await _audit(world, "compute:pools:create")
    answers: list[Any] = []

    async def create() -> None:
        answers.append(await api.pools.create(world.t.root, request, idempotency_key=key))

    async with anyio.create_task_group() as tg:
        for _ in range(12):  # more than the store's pool of 4 connections
            tg.start_soon(create)
    assert len({a.id for a in answers}) == 1 and len(answers) == 12
    assert len(await _audit(world, "compute:pools:create")) == len(before) + 1


async def test_a_failed_call_gives_its_key_back(world: World) -> None:
    api = world.t.compute.api
    missing = UpdatePoolInput(id="pool_0000000000000000", name="x")
    for _ in range(2):  # the second runs again (NOT_FOUND again), not a replay and not "still running"
        with pytest.raises(NotFoundError):
            await api.pools.update(world.t.root, missing, idempotency_key="fails")


async def test_over_http_the_header_carries_the_key(world: World) -> None:
    http = world.t.http
    headers = {"authorization": f"Bearer {world.t.root}", "idempotency-key": "http-1"}
    body = {"tenant": world.t.acme, "name": "over-http"}
    first = await http.post("/api/compute/pools/create", headers=headers, json=body)
    again = await http.post("/api/compute/pools/create", headers=headers, json=body)
    assert first.status_code == again.status_code == 200 and first.json() == again.json()
    other = await http.post("/api/compute/pools/create", headers=headers, json={**body, "name": "another"})
    assert other.status_code == 409 and other.json()["error"]["details"]["reason"] == "idempotency_key_reused"
    # Empty, a space, too long, a byte outside ASCII (latin-1 on the wire), a control character.
    bad_keys: list[bytes] = [b"", b"with space", b"x" * 256, "cl\u00e9".encode("latin-1"), b"tab\there"]
    for bad in bad_keys:
        refused = await http.post(
            "/api/compute/pools/create",
            headers=[(b"authorization", f"Bearer {world.t.root}".encode()), (b"idempotency-key", bad)],
            json=body,
        )
        assert refused.status_code == 400 and refused.json()["error"]["details"]["path"] == "Idempotency-Key"
    listed = await http.post(
        "/api/compute/pools/list", headers={**headers, "idempotency-key": "read"}, json={"tenant": world.t.acme}
    )
    assert listed.status_code == 400 and listed.json()["error"]["code"] == "INVALID_INPUT"


async def test_keys_belong_to_the_principal_that_sent_them(world: World) -> None:
    api = world.t.compute.api
    mine = await api.pools.create(world.t.root, CreatePoolInput(tenant=world.t.acme, name="mine"), idempotency_key="k")
    # Alice's key "k" is another key: her request runs (and its other input is no conflict).
    hers = await api.pools.create(world.t.alice, CreatePoolInput(tenant=world.t.acme, name="hers"), idempotency_key="k")
    assert hers.id != mine.id and hers.name == "hers"


@attrs.frozen(kw_only=True)
class TouchInput:
    tenant: str


@attrs.frozen(kw_only=True)
class Touched:
    ok: bool


@method(mutates=True, resource=lambda i: ResourceRef(type="thing", tenant=i.tenant))
async def touch(call: CallContext, input: TouchInput) -> Touched:
    """A mutation that writes nothing through ``call.transaction()`` (it might call out, say)."""
    return Touched(ok=True)


class ThingsGroup(GroupSpec[B]):
    name = "things"
    touch = touch


async def test_a_mutation_that_opens_no_transaction_is_audited_all_the_same(
    database_url: str, fresh_schema: str
) -> None:
    module = StaticModule(name="things", version="1.0", core_range=">=0.1", groups=(ThingsGroup,), actions=())
    async with two_tenants(database_url, fresh_schema, modules=[module]) as t:
        await t.compute.api.group(ThingsGroup).touch(t.root, TouchInput(tenant=t.acme))
        rows = await t.store.fetch(
            t.store.sql("SELECT tenant, decision_id FROM {s}.audit WHERE action = 'compute:things:touch'"), {}
        )
        assert [(r.tenant, bool(r.decision_id)) for r in rows] == [(t.acme, True)]


class _SlowAfter:
    """A plugin that takes its time after ``pools.create`` returned (its change committed)."""

    name = "slow-after"
    core_range = ">=0.1"
    actions: tuple[str, ...] = ()

    async def intercept(self, intercepted: Intercepted, next: Next) -> Any:
        output = await next(intercepted)
        call = intercepted.call
        if (call.method.group, call.method.name) == ("pools", "create"):
            await anyio.sleep(5)
        return output


async def test_a_call_given_up_after_its_change_committed_is_not_made_twice(
    database_url: str, fresh_schema: str
) -> None:
    async with two_tenants(database_url, fresh_schema, plugins=[_SlowAfter()]) as t:
        request = CreatePoolInput(tenant=t.acme, name="once")
        with anyio.move_on_after(0.5):  # the caller stops waiting; the pool was already created
            await t.compute.api.pools.create(t.root, request, idempotency_key="given-up")
        with pytest.raises(ConflictError) as done:
            await t.compute.api.pools.create(t.root, request, idempotency_key="given-up")
        assert done.value.details["reason"] == "already_done"
        pools = await t.store.fetch(t.store.sql("SELECT id FROM {s}.pools WHERE name = 'once'"), {})
        assert [p.id for p in pools] == [done.value.details["id"]]


async def test_expired_keys_are_purged(world: World) -> None:
    store = world.t.store
    await world.t.compute.api.pools.create(
        world.t.root, CreatePoolInput(tenant=world.t.acme, name="kept"), idempotency_key="old"
    )
    await world.t.compute.api.pools.create(
        world.t.root, CreatePoolInput(tenant=world.t.acme, name="fresh"), idempotency_key="new"
    )
    expire = store.sql("UPDATE {s}.idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = 'old'")
    await store.fetch(expire, {})
    assert await store.idempotency.purge() == 1
    left = await store.fetch(store.sql("SELECT key FROM {s}.idempotency_keys"), {})
    assert [r.key for r in left] == ["new"]
