"""What a caller learns about tenants and ids that are not its own, generated from the registry.

- Every mutating method that names a tenant refuses a tenant that does not exist with ``NOT_FOUND``, and writes
  nothing, even for a root caller.
- Every method whose input addresses a resource by id answers a caller of tenant B exactly the same (status, code,
  message, details apart from the id itself) for tenant A's id as for a random id of the same form: another
  tenant's resource and a missing one cannot be told apart.

Methods of modules added later are covered without edits; a new kind of id fails ``test_ids_...`` until tenant A
below gets a resource of that kind.
"""

from __future__ import annotations

import json
import random
import secrets
import string
import typing
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest

from bettercompute import JoinSettings, LocalKeyKms, MethodDef
from bettercompute.modules.images import RegisterImageInput
from bettercompute.modules.nodes import NODES, CreateJoinTokenInput
from bettercompute.modules.pools import CreatePoolInput
from bettercompute.modules.reservations import CreateReservationInput, ReservationsGroup
from bettercompute.modules.secrets import CreateSecretInput
from bettercompute.modules.webhooks import CreateWebhookInput
from bettercompute.ports import ResourceRef
from bettercompute_iam import IamGroups, ListBindingsInput, ListCredentialsInput

from ..capacity.conftest import seed_fleet
from ..iam.conftest import TwoTenants, two_tenants
from ._principals import add_principal

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

JOIN = JoinSettings(gateway_address="gw.existence.example:443", trust_domain="existence.example")

# Values for the other required fields, so that only the field under test decides the answer.
OTHER_FIELDS: dict[str, Any] = {
    "name": "probe",
    "url": "https://hooks.example.com/in",
    "value": "v",
    "kind": "user",
    "role": "compute.viewer",
    "scope_type": "tenant",
    "actions": ["compute:pools:get"],
    "expires_in_seconds": 3600,
    "gpus": 1,
    "sha256": "d" * 64,
    "port": 22,
}
# Optional fields some methods need to get past their own checks (a reservation's end).
EXTRA_FIELDS: dict[str, dict[str, Any]] = {
    "/reservations/create": {"duration": "PT1H"},
    "/reservations/extend": {"duration": "PT1H"},
    "/images/register": {"kind": "disk", "url": "https://images.example.com/a.img"},
}
# Methods whose tenant is optional (left out: every tenant's rows, for the root scope): a tenant's admin names its own.
OPTIONAL_TENANT = frozenset({"/audit/list"})
# Ids that do not decide the resource (``devices.get``'s device id: its node does): any well-formed one.
UNADDRESSED: dict[str, Any] = {"id": "dev_000000000000000000000000"}


@attrs.frozen(kw_only=True)
class World:
    t: TwoTenants
    schema: str
    # Tenant A's (acme's) resources by kind: what a caller of tenant B (globex) asks for.
    theirs: dict[str, str]
    # Tenant B's own, for the other id fields of an input, so that only the field under test decides.
    ours: dict[str, str]
    url: str

    async def post(self, credential: str, method: MethodDef[Any, Any], body: dict[str, Any]) -> tuple[int, Any]:
        response = await self.t.http.post(
            f"/api/compute{method.path}", headers={"authorization": f"Bearer {credential}"}, json=body
        )
        return response.status_code, response.json()

    def fingerprint(self) -> dict[str, str]:
        """Every table's content. ``iam_credentials`` by count only: authenticating touches ``last_used_at``."""
        out = {}
        with psycopg.connect(self.url) as conn:
            tables = conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (self.schema,)
            ).fetchall()
            for (table,) in tables:
                q = f'"{self.schema}"."{table}"'
                if table == "iam_credentials":
                    row = conn.execute(f"SELECT count(*)::text FROM {q}").fetchone()
                else:
                    row = conn.execute(
                        f"SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM {q} t"
                    ).fetchone()
                assert row is not None
                out[table] = row[0]
        return out


@pytest.fixture
async def world(database_url: str, fresh_schema: str, tmp_path: Path) -> AsyncIterator[World]:
    kms = LocalKeyKms(tmp_path / "kms.key")
    async with two_tenants(database_url, fresh_schema, kms=kms, join=JOIN) as t:
        api = t.compute.api
        pool = await api.pools.create(t.alice, CreatePoolInput(tenant=t.acme, name="gpus"))
        token = await api.join_tokens.create(t.alice, CreateJoinTokenInput(pool_id=pool.id))
        async with t.store.transaction() as tx:
            # A node as JoinService enrolls and projects one (the join itself is covered in tests/integration/joins).
            enrolled = await tx.repository(NODES).enroll(
                new_id=f"node_{secrets.token_hex(8)}",
                pool_id=pool.id,
                tenant=t.acme,
                hardware_key=secrets.token_hex(16),
                claims={},
                attestation={},
                join_token_id=token.id,
                reclaim=False,
            )
            await tx.project(ResourceRef(type="node", id=enrolled.node.id, tenant=t.acme, pool=pool.id))
        seed_fleet(database_url, fresh_schema, tenant=t.acme, pool=pool.id, nodes=1)
        reservation = await t.compute.api.group(ReservationsGroup).create(
            t.alice, CreateReservationInput(tenant=t.acme, pool_id=pool.id, gpus=1, duration="PT1H")
        )
        hook = await api.webhooks.create(t.alice, CreateWebhookInput(tenant=t.acme, url="https://hooks.example.com/a"))
        await api.secrets.create(
            t.alice, CreateSecretInput(tenant=t.acme, name="db-password", scope=f"pool:{pool.id}", value="s3cret")
        )
        image = await api.images.register(
            t.alice,
            RegisterImageInput(
                tenant=t.acme, name="os", kind="disk", url="https://images.example.com/os.img", sha256="e" * 64
            ),
        )
        binding = (await IamGroups(api).bindings.list(t.root, ListBindingsInput(tenant=t.acme))).bindings[0]
        credential = (await IamGroups(api).credentials.list(t.root, ListCredentialsInput(tenant=t.acme))).credentials[0]
        theirs = {
            "pool": pool.id,
            "join-token": token.id,
            "node": enrolled.node.id,
            "webhook": hook.webhook.id,
            "secret": "db-password",
            "principal": binding.principal_id,
            "binding": binding.id,
            "credential": credential.id,
            "reservation": reservation.id,
            "image": image.id,
            # audit.list's resource_id filter: any resource of A's (what another tenant's rows would name).
            "resource": pool.id,
        }
        own = (await IamGroups(api).bindings.list(t.root, ListBindingsInput(tenant=t.globex))).bindings[0]
        ours = {
            "principal": own.principal_id,
            "pool": (await api.pools.create(t.mallory, CreatePoolInput(tenant=t.globex, name="ours"))).id,
        }
        yield World(t=t, schema=fresh_schema, theirs=theirs, ours=ours, url=database_url)


def _required(method: MethodDef[Any, Any]) -> list[str]:
    return [f.name for f in attrs.fields(method.input) if f.default is attrs.NOTHING]


def _str_fields(method: MethodDef[Any, Any]) -> list[str]:
    hints = typing.get_type_hints(method.input)
    return [f.name for f in attrs.fields(method.input) if hints[f.name] in (str, str | None)]


# --- unknown tenants --------------------------------------------------------------------------------------------


def _mutating_with_tenant(world: World) -> list[MethodDef[Any, Any]]:
    return [m for m in world.t.compute.registry.methods() if m.mutates and "tenant" in _required(m)]


async def test_a_tenant_that_does_not_exist_is_not_found_and_nothing_is_written(world: World) -> None:
    methods = _mutating_with_tenant(world)
    assert {"pools.create", "secrets.create", "webhooks.create", "principals.create", "roles.create"} <= {
        f"{m.group}.{m.name}" for m in methods
    }
    pool = world.theirs["pool"]
    acme = world.t.acme
    # A tenant never made, and look-alikes of existing ones: another case, full-width letters and digits.
    look_alikes = [acme.upper(), "ROOT", acme.translate({c: c + 0xFEE0 for c in range(0x21, 0x7F)})]
    for method in methods:
        for ghost in [f"tn_{secrets.token_hex(8)}", *look_alikes]:
            body: dict[str, Any] = {}
            for name in _required(method):
                if name == "tenant":
                    body[name] = ghost
                elif name == "scope":
                    body[name] = f"pool:{pool}"
                elif name in OTHER_FIELDS:
                    body[name] = OTHER_FIELDS[name]
                else:  # an id: a real one of tenant A, so that only the tenant is wrong
                    body[name] = world.theirs[_addressed(method)[name]]
            body |= EXTRA_FIELDS.get(method.path, {})
            before = world.fingerprint()
            status, answer = await world.post(world.t.root, method, body)
            where = (method.path, ghost, answer)
            if ghost in look_alikes:
                # A tenant field may refuse the form itself (INVALID_INPUT); it never reaches a real tenant.
                assert (status, answer["error"]["code"]) in ((404, "NOT_FOUND"), (400, "INVALID_INPUT")), where
            else:
                assert (status, answer["error"]["code"]) == (404, "NOT_FOUND"), where
            assert world.fingerprint() == before, where


# --- existence oracle -------------------------------------------------------------------------------------------


def _probe(method: MethodDef[Any, Any], fields: dict[str, Any]) -> Any:
    """An input with ``fields`` and placeholders for the other required ones (validators off: only for reading
    which resource the method is decided on)."""
    kwargs = {name: OTHER_FIELDS.get(name, "x") for name in _required(method)} | fields
    with attrs.validators.disabled():
        return method.input(**kwargs)


def _addressed(method: MethodDef[Any, Any]) -> dict[str, str]:
    """The fields of ``method``'s input that address an existing resource by id, with that resource's kind."""
    found = {}
    for name in _str_fields(method):
        if name == "tenant":
            continue
        if name.endswith("_id"):
            # scope_id names a pool when scope_type is "pool" (set so in the bodies below).
            found[name] = "pool" if name == "scope_id" else name.removesuffix("_id")
        elif method.name != "create":  # a create's name is the new resource's, it addresses nothing
            resource = method.resource(_probe(method, {name: "probe-value"}))
            if resource.id == "probe-value":
                found[name] = resource.type
    return found


def _same_form(value: str) -> str:
    """A random id shaped like ``value``: its prefix (up to the last ``_``) kept, each other character redrawn
    from its own class."""
    prefix, _, rest = value.rpartition("_")
    alphabet = {
        "digit": string.digits,
        "hex": "0123456789abcdef",
        "lower": string.ascii_lowercase,
        "upper": string.ascii_uppercase,
    }

    def redraw(c: str) -> str:
        if c in alphabet["hex"]:
            return random.choice(alphabet["hex"])
        for chars in alphabet.values():
            if c in chars:
                return random.choice(chars)
        return c

    return f"{prefix}{'_' if prefix else ''}{''.join(redraw(c) for c in rest)}"


def _blind(answer: Any, asked: str) -> Any:
    """``answer`` with the id that was asked for replaced (its echo is the only difference allowed); of a success,
    only its shape (a create makes fresh ids and times each time)."""
    if "data" in answer and isinstance(answer["data"], dict):
        return {"data": sorted(answer["data"])}
    return json.loads(json.dumps(answer).replace(asked, "<asked>"))


async def test_ids_of_another_tenant_and_unknown_ids_get_the_same_answer(world: World) -> None:
    t = world.t
    # B's callers with full rights in B: its admin (tenant scope), and a service account of B bound on the root
    # scope (whose unknown ids reach the handlers, so their messages are compared with IAM's too).
    callers = {
        "tenant admin": t.mallory,
        "root-scope account": add_principal(world.url, world.schema, t.globex, ["*:*:*"], scope_type="root"),
    }
    covered = set()
    for method in t.compute.registry.methods():
        for field, kind in _addressed(method).items():
            assert kind in world.theirs, f"{method.path}.{field}: give tenant A a {kind} in the world fixture"
            covered.add(f"{method.group}.{method.name}")
            theirs = world.theirs[kind]
            for who, credential in callers.items():
                others = _addressed(method)
                body: dict[str, Any] = {
                    name: world.ours[others[name]]
                    if name in others and name != field
                    else OTHER_FIELDS.get(name, UNADDRESSED.get(name, ""))
                    for name in _required(method)
                }
                if "tenant" in body or method.path in OPTIONAL_TENANT:
                    body["tenant"] = t.globex
                body |= EXTRA_FIELDS.get(method.path, {})
                if field == "scope_id":
                    body["scope_type"] = "pool"
                answers = []
                for asked in (theirs, _same_form(theirs)):
                    status, answer = await world.post(credential, method, {**body, field: asked})
                    answers.append((status, _blind(answer, asked)))
                where = f"{method.path} {field} ({who})"
                assert answers[0] == answers[1], where
                status, answer = answers[0]
                if method.name == "list" or (method.group, method.name) == ("webhooks", "deliveries"):
                    # A filter naming someone else's id lists nothing, as an unknown id does (or is NOT_FOUND).
                    assert status in (200, 404), (where, answer)
                elif (method.group, method.name, field) == ("bindings", "create", "scope_id"):
                    # A binding's scope is granted, not read: which pools one may name is the rule for acting on
                    # principals (refused, or a binding that decides nothing outside B). Only sameness matters here.
                    assert status in (200, 403, 404), (where, answer)
                else:
                    assert (status, answer["error"]["code"]) == (404, "NOT_FOUND"), (where, answer)
    # The methods the issue names, at least.
    assert {
        "pools.get",
        "pools.update",
        "join-tokens.get",
        "join-tokens.revoke",
        "join-tokens.create",
        "quotas.set",
        "quotas.get",
        "quotas.list",
        "capacity.get",
        "nodes.get",
        "nodes.revoke",
        "nodes.retire",
        "webhooks.delete",
        "webhooks.test",
        "webhooks.deliveries",
        "secrets.delete",
        "principals.disable",
        "credentials.revoke",
        "bindings.delete",
    } <= covered
    # Tenant A's resources are all still there and untouched.
    assert (
        await t.http.post(
            "/api/compute/pools/get", headers={"authorization": f"Bearer {t.alice}"}, json={"id": world.theirs["pool"]}
        )
    ).status_code == 200
