"""Every list method pages: generated from the registry, so a list added later is covered (or the test says it lacks
a seed). Each list gets more rows than one page holds; following ``next_cursor`` sees every row once, in the order
of one big page, and the last page says there is no more. A forged cursor is refused, and never shows another
tenant's rows.
"""

from __future__ import annotations

import base64
import json
import math
import secrets
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import httpx
import psycopg
import pytest

from bettercompute import BetterCompute, JoinSettings, LocalKeyKms, MethodDef, Options, better_compute
from bettercompute.paging import MAX_LIMIT, is_list_method, items_field
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

ROWS = 5
LIMIT = 2


def _compose(url: str, schema: str, kms_dir: Path) -> BetterCompute:
    # A KMS makes the webhooks and secrets groups exist, and join settings the nodes group: every list is here.
    return better_compute(
        Options(
            store=PgStore(url, schema=schema, pool_size=4),
            iam=EmbeddedIam(),
            kms=LocalKeyKms(kms_dir / "kms.key"),
            join=JoinSettings(gateway_address="gw.paging.example:443", trust_domain="paging.example"),
        )
    )


def _list_methods() -> list[str]:
    compute = _compose("postgresql://nobody@127.0.0.1:1/none", "unused", Path(tempfile.gettempdir()))
    return [f"{m.group}/{m.name}" for m in compute.registry.methods() if is_list_method(m.name, m.input, m.output)]


@attrs.frozen(kw_only=True)
class Lists:
    compute: BetterCompute
    http: httpx.AsyncClient
    root: str
    url: str
    schema: str

    async def call(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return await self.http.post(f"/api/compute/{path}", headers={"authorization": f"Bearer {self.root}"}, json=body)

    async def ok(self, path: str, body: dict[str, Any]) -> Any:
        response = await self.call(path, body)
        assert response.status_code == 200, response.text
        return response.json()["data"]

    async def tenant(self) -> str:
        created = await self.ok("tenants/create", {"name": f"t-{secrets.token_hex(4)}"})
        return str(created["id"])

    async def principal(self, tenant: str) -> str:
        body = {"tenant": tenant, "name": f"p-{secrets.token_hex(4)}", "kind": "service_account"}
        return str((await self.ok("principals/create", body))["id"])

    async def pool(self, tenant: str) -> str:
        return str((await self.ok("pools/create", {"tenant": tenant, "name": f"p-{secrets.token_hex(4)}"}))["id"])

    async def webhook(self, tenant: str) -> str:
        body = {"tenant": tenant, "url": "https://hooks.example.com/in"}
        return str((await self.ok("webhooks/create", body))["webhook"]["id"])


@pytest.fixture
async def lists(database_url: str, fresh_schema: str) -> AsyncIterator[Lists]:
    kms_dir = Path(tempfile.gettempdir()) / f"bc-paging-{uuid.uuid4().hex}"
    compute = _compose(database_url, fresh_schema, kms_dir)
    await compute.initialize()
    iam = compute.options.iam
    assert isinstance(iam, EmbeddedIam)
    boot = await iam.bootstrap()
    assert boot.credential is not None
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=compute.asgi), base_url="http://t") as http:
            yield Lists(compute=compute, http=http, root=boot.credential, url=database_url, schema=fresh_schema)
    finally:
        await compute.close()
        shutil.rmtree(kms_dir, ignore_errors=True)


# --- seeds: for each list, ROWS rows of a fresh tenant (or pool, principal, webhook); returns the list's filter ----

Seed = Callable[[Lists], Awaitable[dict[str, Any]]]


async def _tenants(lists: Lists) -> dict[str, Any]:
    for _ in range(ROWS):
        await lists.tenant()
    return {}


async def _principals(lists: Lists) -> dict[str, Any]:
    tenant = await lists.tenant()
    for _ in range(ROWS):
        await lists.principal(tenant)
    return {"tenant": tenant}


async def _credentials(lists: Lists) -> dict[str, Any]:
    tenant = await lists.tenant()
    principal = await lists.principal(tenant)
    for _ in range(ROWS):
        body = {"tenant": tenant, "principal_id": principal, "expires_in_seconds": None}
        await lists.ok("credentials/create", body)
    return {"tenant": tenant, "principal_id": principal}


async def _roles(lists: Lists) -> dict[str, Any]:
    tenant = await lists.tenant()
    for i in range(ROWS):
        await lists.ok("roles/create", {"tenant": tenant, "name": f"role-{i}", "actions": ["compute:pools:get"]})
    return {"tenant": tenant}


async def _bindings(lists: Lists) -> dict[str, Any]:
    tenant = await lists.tenant()
    principal = await lists.principal(tenant)
    for i in range(ROWS):
        role = await lists.ok("roles/create", {"tenant": tenant, "name": f"r-{i}", "actions": ["compute:pools:get"]})
        body = {"tenant": tenant, "principal_id": principal, "role": role["id"], "scope_type": "tenant"}
        await lists.ok("bindings/create", body)
    return {"tenant": tenant, "principal_id": principal}


async def _pools(lists: Lists) -> dict[str, Any]:
    tenant = await lists.tenant()
    for _ in range(ROWS):
        await lists.pool(tenant)
    return {"tenant": tenant}


async def _images(lists: Lists) -> dict[str, Any]:
    tenant = await lists.tenant()
    for i in range(ROWS):
        body = {
            "tenant": tenant,
            "name": f"img-{i}",
            "kind": "disk",
            "url": f"https://i.example/{i}",
            "sha256": "c" * 64,
        }
        await lists.ok("images/register", body)
    return {"tenant": tenant}


async def _join_tokens(lists: Lists) -> dict[str, Any]:
    pool = await lists.pool(await lists.tenant())
    for _ in range(ROWS):
        await lists.ok("join-tokens/create", {"pool_id": pool})
    return {"pool_id": pool}


async def _quotas(lists: Lists) -> dict[str, Any]:
    pool = await lists.pool(await lists.tenant())
    # The pool's default and a row per tenant: the default sorts first, then the tenants by id.
    await lists.ok("quotas/set", {"pool_id": pool, "max_gpus": 8})
    for _ in range(ROWS - 1):
        await lists.ok("quotas/set", {"pool_id": pool, "tenant": await lists.tenant(), "max_gpus": 1})
    return {"pool_id": pool}


async def _secrets(lists: Lists) -> dict[str, Any]:
    tenant = await lists.tenant()
    pool = await lists.pool(tenant)
    # Names out of creation order: a page follows the key (the name), not the insertion order.
    for name in ("delta", "alpha", "echo", "bravo", "charlie"):
        await lists.ok("secrets/create", {"tenant": tenant, "name": name, "scope": f"pool:{pool}", "value": "v"})
    return {"tenant": tenant}


async def _webhooks(lists: Lists) -> dict[str, Any]:
    tenant = await lists.tenant()
    for _ in range(ROWS):
        await lists.webhook(tenant)
    return {"tenant": tenant}


async def _deliveries(lists: Lists) -> dict[str, Any]:
    tenant = await lists.tenant()
    webhook = await lists.webhook(tenant)
    for _ in range(ROWS):
        await lists.ok("webhooks/test", {"tenant": tenant, "id": webhook})
    return {"tenant": tenant, "id": webhook}


async def _nodes(lists: Lists) -> dict[str, Any]:
    tenant = await lists.tenant()
    pool = await lists.pool(tenant)
    # Joins need the gateway's wire; the rows are what the list reads. One statement gives every node the same
    # created_at, so the page boundary falls inside a tie that only the id breaks.
    with psycopg.connect(lists.url, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{lists.schema}".nodes (id, tenant, pool_id, state, hardware_key)'
            f" SELECT 'node_' || md5(random()::text), %s, %s, 'adopting', 'hw-' || i FROM generate_series(1, %s) i",
            (tenant, pool, ROWS),
        )
    return {"tenant": tenant}


async def _devices(lists: Lists) -> dict[str, Any]:
    tenant = await lists.tenant()
    pool = await lists.pool(tenant)
    # Devices come from the inventory controller; the rows are what the list reads: one node, NICs and GPUs whose
    # identities sort apart from their insertion order.
    with psycopg.connect(lists.url, autocommit=True) as conn:
        node = "node_" + secrets.token_hex(6)
        conn.execute(
            f'INSERT INTO "{lists.schema}".nodes (id, tenant, pool_id, state, hardware_key)'
            " VALUES (%s, %s, %s, %s, %s)",
            (node, tenant, pool, "adopting", "hw-" + node),
        )
        conn.execute(
            f'INSERT INTO "{lists.schema}".devices (id, node_id, tenant, pool_id, kind, ident, state)'
            " SELECT 'dev_' || md5(random()::text), %s, %s, %s, CASE WHEN i %% 2 = 0 THEN 'gpu' ELSE 'nic' END,"
            " md5(i::text), 'present' FROM generate_series(1, %s) i",
            (node, tenant, pool, ROWS),
        )
    return {"tenant": tenant}


async def _reservations(lists: Lists) -> dict[str, Any]:
    tenant = await lists.tenant()
    pool = await lists.pool(tenant)
    # Admission is tested with the capacity module; the rows are what the list reads, all made at the same moment
    # (one statement), so the page boundary falls inside a tie that only the id breaks. A draft is never listed.
    with psycopg.connect(lists.url, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{lists.schema}".reservations'
            " (id, tenant, pool_id, state, gpus, start_at, end_at, created_by, created_at, updated_at)"
            " SELECT 'rsv_' || md5(random()::text), %s, %s, CASE WHEN i = 1 THEN 'draft' ELSE 'placed' END, 1,"
            " now(), now() + interval '1 hour', 'seed', now(), now() FROM generate_series(0, %s) i",
            (tenant, pool, ROWS),
        )
    return {"tenant": tenant}


async def _audit(lists: Lists) -> dict[str, Any]:
    # Each registration writes one audit row of the tenant (creating the tenant wrote one too).
    return await _images(lists)


async def _keys(lists: Lists) -> dict[str, Any]:
    # The control plane's own: one of each kind at the start; each rotation adds an instruction key.
    for _ in range(ROWS):
        await lists.ok("keys/rotate", {"kind": "instructions"})
    return {}


SEEDS: dict[str, Seed] = {
    "tenants/list": _tenants,
    "principals/list": _principals,
    "credentials/list": _credentials,
    "roles/list": _roles,
    "bindings/list": _bindings,
    "pools/list": _pools,
    "images/list": _images,
    "join-tokens/list": _join_tokens,
    "quotas/list": _quotas,
    "secrets/list": _secrets,
    "webhooks/list": _webhooks,
    "webhooks/deliveries": _deliveries,
    "nodes/list": _nodes,
    "devices/list": _devices,
    "reservations/list": _reservations,
    "audit/list": _audit,
    "keys/list": _keys,
}


def _method(lists: Lists, path: str) -> MethodDef[Any, Any]:
    group, name = path.split("/")
    method = lists.compute.registry.method(group, name)
    assert method is not None
    return method


def _identity(item: dict[str, Any]) -> str:
    return str(item.get("id", json.dumps(item, sort_keys=True)))


async def _walk(lists: Lists, path: str, filter: dict[str, Any], field: str) -> list[list[dict[str, Any]]]:
    pages: list[list[dict[str, Any]]] = []
    cursor: str | None = None
    while True:
        page = await lists.ok(path, {**filter, "limit": LIMIT, "cursor": cursor})
        pages.append(page[field])
        cursor = page["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) <= 1000, "the cursor never ran out"


def test_every_list_method_has_a_seed() -> None:
    assert set(_list_methods()) == set(SEEDS)


@pytest.mark.parametrize("path", _list_methods())
async def test_following_next_cursor_sees_every_row_once_in_a_stable_order(lists: Lists, path: str) -> None:
    field = items_field(_method(lists, path).output)
    filter = await SEEDS[path](lists)
    whole = await lists.ok(path, {**filter, "limit": MAX_LIMIT})
    assert whole["next_cursor"] is None
    everything = whole[field]
    assert len(everything) >= ROWS

    pages = await _walk(lists, path, filter, field)
    walked = [item for page in pages for item in page]
    assert [_identity(i) for i in walked] == [_identity(i) for i in everything]
    assert len({_identity(i) for i in walked}) == len(walked)
    assert len(pages) == math.ceil(len(everything) / LIMIT)
    assert all(len(page) == LIMIT for page in pages[:-1]) and 1 <= len(pages[-1]) <= LIMIT
    # The same walk again gives the same pages: the order does not depend on the plan of the day.
    assert await _walk(lists, path, filter, field) == pages
    # Without a limit, a page holds the default (100), so these few rows are one page.
    assert (await lists.ok(path, filter))[field] == everything


@pytest.mark.parametrize("path", _list_methods())
async def test_a_garbled_or_foreign_cursor_is_invalid_input(lists: Lists, path: str) -> None:
    filter = await SEEDS[path](lists)
    first = await lists.ok(path, {**filter, "limit": 1})
    good = first["next_cursor"]
    assert good is not None
    # Another list's cursor (this one's action swapped), bad base64, bad JSON, keys of the wrong shape or type, NUL
    # and an unpaired surrogate spelled as JSON escapes, a bigint overflow, a naive datetime: all one answer.
    decoded = json.loads(base64.urlsafe_b64decode(good + "=" * (-len(good) % 4)))

    def forge(body: Any) -> str:
        return base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()

    forged = [
        forge({**decoded, "m": "compute:other:list"}),
        "!!!",
        "a" * 5000,
        forge("not an object"),
        forge({"m": decoded["m"], "k": []}),
        forge({"m": decoded["m"], "k": [*decoded["k"], "extra"]}),
        forge({"m": decoded["m"], "k": [{"nested": 1}] * len(decoded["k"])}),
        forge({"m": decoded["m"], "k": ["\x00"] * len(decoded["k"])}),
        forge({"m": decoded["m"], "k": [2**70] * len(decoded["k"])}),
        forge({**decoded, "extra": 1}),
        base64.urlsafe_b64encode(b'{"m":"' + decoded["m"].encode() + b'","k":["\\ud800"]}').decode().rstrip("="),
    ]
    naive = [p[:-6] if isinstance(p, str) and p.endswith("+00:00") else p for p in decoded["k"]]
    if naive != decoded["k"]:
        forged.append(forge({**decoded, "k": naive}))  # a datetime part without its zone
    for cursor in forged:
        response = await lists.call(path, {**filter, "limit": 1, "cursor": cursor})
        assert response.status_code == 400, (cursor, response.text)
        error = response.json()["error"]
        assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == "cursor"
        assert cursor[:40] not in response.text
    for limit in (0, -1, MAX_LIMIT + 1, True, "10", 1.5):
        response = await lists.call(path, {**filter, "limit": limit})
        assert response.status_code == 400 and response.json()["error"]["details"]["path"] == "limit", response.text


async def test_a_cursor_never_shows_another_tenants_rows(lists: Lists) -> None:
    theirs = (await _pools(lists))["tenant"]
    ours = (await _pools(lists))["tenant"]
    their_pools = await lists.ok("pools/list", {"tenant": theirs})
    our_pools = await lists.ok("pools/list", {"tenant": ours})
    assert {p["tenant"] for p in our_pools["pools"]} == {ours}
    # Their cursor, and one forged to start before anything, with our tenant: only our pools, never theirs.
    their_cursor = (await lists.ok("pools/list", {"tenant": theirs, "limit": 1}))["next_cursor"]
    decoded = json.loads(base64.urlsafe_b64decode(their_cursor + "=" * (-len(their_cursor) % 4)))
    earliest = {**decoded, "k": ["0001-01-01T00:00:00+00:00", ""]}
    forged = base64.urlsafe_b64encode(json.dumps(earliest).encode()).rstrip(b"=").decode()
    for cursor in (their_cursor, forged):
        seen = await lists.ok("pools/list", {"tenant": ours, "cursor": cursor})
        assert {p["tenant"] for p in seen["pools"]} <= {ours}
        assert not {p["id"] for p in seen["pools"]} & {p["id"] for p in their_pools["pools"]}
    everything = await lists.ok("pools/list", {"tenant": ours, "cursor": forged})
    assert everything["pools"] == our_pools["pools"]
