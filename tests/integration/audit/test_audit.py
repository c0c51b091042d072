"""The ``audit`` group: a tenant's admins read the tenant's rows and only those, root reads every row; filters and
paging; bad input refused at its field. The table and its chain are append-only in PostgreSQL itself, and
``audit.verify`` finds a row removed or altered by a superuser behind the trigger's back."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import psycopg
import pytest

from bettercompute.errors import AccessDeniedError, NotFoundError
from bettercompute.modules.audit import (
    AUDIT_LOG,
    AuditEntry,
    GetAuditInput,
    ListAuditInput,
    VerifyAuditInput,
    link_audit,
)
from bettercompute.modules.images import RegisterImageInput

from ..iam.conftest import make_user
from .conftest import Plane

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

SHA = "0123456789abcdef" * 4


async def _image(plane: Plane, credential: str, tenant: str, name: str) -> str:
    made = await plane.compute.api.images.register(
        credential,
        RegisterImageInput(tenant=tenant, name=name, kind="kernel", url=f"https://example.com/{name}", sha256=SHA),
    )
    return made.id


async def _link_all(plane: Plane) -> int:
    """Run the job's passes until every row is linked: a row waits for every transaction of the database that began
    before it (other tests' too), so one pass may link nothing yet."""
    log = plane.store.repository(AUDIT_LOG)
    linked = 0
    async with asyncio.timeout(60):
        while True:
            linked += await link_audit(plane.compute.context)
            if await log.unlinked(after=await log.linked_until()) == 0:
                return linked
            await asyncio.sleep(0.05)


async def _all(plane: Plane, credential: str, **filters: Any) -> list[AuditEntry]:
    entries: list[AuditEntry] = []
    cursor = None
    while True:
        page = await plane.audit.list(credential, ListAuditInput(limit=2, cursor=cursor, **filters))
        entries += page.entries
        if page.next_cursor is None:
            return entries
        cursor = page.next_cursor


async def test_a_tenant_reads_its_own_rows_and_root_reads_every_row(plane: Plane) -> None:
    kernel = await _image(plane, plane.alice, plane.acme, "vmlinuz")
    await _image(plane, plane.alice, plane.acme, "other")
    theirs = await _image(plane, plane.mallory, plane.globex, "secret-kernel")

    acme = await _all(plane, plane.alice, tenant=plane.acme)
    assert [e.resource_id for e in acme if e.action == "compute:images:register"] == [kernel, acme[-1].resource_id]
    assert all(e.tenant == plane.acme for e in acme) and theirs not in {e.resource_id for e in acme}
    assert [e.id for e in acme] == sorted(e.id for e in acme), "oldest first"

    # Another tenant's rows, or every row, are not an admin's to read.
    for tenant in (plane.globex, None):
        with pytest.raises(AccessDeniedError):
            await plane.audit.list(plane.alice, ListAuditInput(tenant=tenant))
    row = next(e for e in await _all(plane, plane.mallory, tenant=plane.globex) if e.resource_id == theirs)
    with pytest.raises(NotFoundError):  # another tenant's row, asked as alice's tenant: as if there were none
        await plane.audit.get(plane.alice, GetAuditInput(id=row.id, tenant=plane.acme))
    with pytest.raises(AccessDeniedError):
        await plane.audit.get(plane.alice, GetAuditInput(id=row.id, tenant=plane.globex))

    everything = await _all(plane, plane.root)
    assert {plane.acme, plane.globex} <= {e.tenant for e in everything}
    assert await plane.audit.get(plane.root, GetAuditInput(id=row.id)) == row

    # A viewer of the tenant reads none of it (audit is for those who manage the tenant).
    _, viewer, _ = await make_user(plane, plane.acme, "vera", "compute.viewer")  # type: ignore[arg-type]
    with pytest.raises(AccessDeniedError):
        await plane.audit.list(viewer, ListAuditInput(tenant=plane.acme))


async def test_filters_narrow_the_rows(plane: Plane) -> None:
    before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    first = await _image(plane, plane.alice, plane.acme, "one")
    await _image(plane, plane.alice, plane.acme, "two")
    by_resource = await _all(plane, plane.alice, tenant=plane.acme, resource_type="image", resource_id=first)
    assert [e.resource_id for e in by_resource] == [first]
    actor = by_resource[0].actor
    by_actor = await _all(plane, plane.alice, tenant=plane.acme, actor=actor, action="compute:images:register")
    assert len(by_actor) == 2 and {e.actor for e in by_actor} == {actor}
    assert await _all(plane, plane.alice, tenant=plane.acme, action="compute:images:register", until=before) == []
    assert len(await _all(plane, plane.alice, tenant=plane.acme, action="compute:images:register", since=before)) == 2
    assert await _all(plane, plane.alice, tenant=plane.acme, actor="user:nobody") == []


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"action": "images register"}, "action"),
        ({"action": "compute:images:register\u202e"}, "action"),
        ({"actor": "user:\x00alice"}, "actor"),
        ({"actor": "a" * 257}, "actor"),
        ({"resource_type": "Image"}, "resource_type"),
        ({"resource_id": "img\u200f1"}, "resource_id"),
        ({"tenant": "acme/../globex"}, "tenant"),
        ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "since"),
        ({"since": "yesterday"}, "since"),
        ({"limit": 0}, "limit"),
        ({"cursor": "not-a-cursor"}, "cursor"),
    ],
)
async def test_bad_filters_are_refused_at_their_field(plane: Plane, body: dict[str, Any], path: str) -> None:
    response = await plane.post("audit/list", {"tenant": plane.acme, **body})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == path


async def test_get_refuses_a_bad_id(plane: Plane) -> None:
    for bad in (0, -1, 2**63, "1", 1.5):
        response = await plane.post("audit/get", {"id": bad, "tenant": plane.acme})
        assert response.status_code == 400 and response.json()["error"]["details"]["path"] == "id"
    with pytest.raises(NotFoundError):
        await plane.audit.get(plane.root, GetAuditInput(id=2**62))


@pytest.mark.parametrize("table", ["audit", "audit_chain"])
async def test_the_tables_are_append_only_in_postgresql_itself(plane: Plane, table: str) -> None:
    await _image(plane, plane.alice, plane.acme, "vmlinuz")
    await _link_all(plane)
    async with await psycopg.AsyncConnection.connect(plane.url, autocommit=True) as conn:
        for statement in (
            f'UPDATE "{plane.schema}".{table} SET {"actor = actor" if table == "audit" else "seq = seq"}',
            f'DELETE FROM "{plane.schema}".{table}',
            f'TRUNCATE "{plane.schema}".{table}',
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                await conn.execute(statement)
        rows = await conn.execute(f'SELECT count(*) FROM "{plane.schema}".{table}')
        assert (await rows.fetchone()) != (0,)


async def test_the_chain_links_every_row_once_and_verify_holds(plane: Plane) -> None:
    await _image(plane, plane.alice, plane.acme, "one")
    await _image(plane, plane.mallory, plane.globex, "two")
    assert await _link_all(plane) > 0
    assert await link_audit(plane.compute.context) == 0, "a row is linked once"
    await _image(plane, plane.alice, plane.acme, "three")
    assert await _link_all(plane) == 1

    entries = await _all(plane, plane.alice, tenant=plane.acme)
    assert [e.chain_seq for e in entries] == list(range(1, len(entries) + 1)), "each tenant has a chain of its own"
    assert all(e.hash is not None and len(e.hash) == 64 for e in entries)
    verified = await plane.audit.verify(plane.root, VerifyAuditInput())
    assert verified.ok and verified.problems == () and verified.unlinked == 0
    assert {plane.acme, plane.globex} <= set(verified.heads)
    assert (verified.heads[plane.acme].seq, verified.heads[plane.acme].hash) == (len(entries), entries[-1].hash)
    mine = await plane.audit.verify(plane.alice, VerifyAuditInput(tenant=plane.acme))
    assert mine.ok and mine.rows == len(entries) and set(mine.heads) == {plane.acme}
    with pytest.raises(AccessDeniedError):
        await plane.audit.verify(plane.alice, VerifyAuditInput())


async def _as_superuser_behind_the_trigger(plane: Plane, statement: str) -> None:
    async with await psycopg.AsyncConnection.connect(plane.url, autocommit=True) as conn:
        await conn.execute("SET session_replication_role = replica")
        await conn.execute(statement.replace("{s}", f'"{plane.schema}"'))


async def test_verify_finds_a_row_removed_or_altered_by_a_superuser(plane: Plane) -> None:
    ids = [await _image(plane, plane.alice, plane.acme, name) for name in ("one", "two", "three", "four")]
    await _link_all(plane)
    rows = {e.resource_id: e for e in await _all(plane, plane.alice, tenant=plane.acme)}
    removed, altered = rows[ids[1]], rows[ids[2]]
    await _as_superuser_behind_the_trigger(plane, f"DELETE FROM {{s}}.audit WHERE id = {removed.id}")
    await _as_superuser_behind_the_trigger(
        plane, f"UPDATE {{s}}.audit SET actor = 'user:someone-else' WHERE id = {altered.id}"
    )
    verified = await plane.audit.verify(plane.alice, VerifyAuditInput(tenant=plane.acme))
    assert not verified.ok
    found = {(p.audit_id, p.reason) for p in verified.problems}
    assert found == {(removed.id, "missing_row"), (altered.id, "altered")}

    # Removing the link too leaves a gap in the sequence.
    await _as_superuser_behind_the_trigger(plane, f"DELETE FROM {{s}}.audit_chain WHERE audit_id = {removed.id}")
    again = await plane.audit.verify(plane.alice, VerifyAuditInput(tenant=plane.acme))
    assert (rows[ids[2]].id, "gap") in {(p.audit_id, p.reason) for p in again.problems}


async def test_a_row_of_a_transaction_still_open_waits_and_is_linked_after_it(plane: Plane) -> None:
    one = await _image(plane, plane.alice, plane.acme, "one")
    async with await psycopg.AsyncConnection.connect(plane.url) as conn:
        # A transaction that wrote an audit row and has not committed yet: rows written after it began must wait
        # for it, or it would have to be put in between two links once it commits.
        await conn.execute(
            f'INSERT INTO "{plane.schema}".audit (action, actor, tenant, resource_type, outcome) '
            "VALUES ('compute:images:register', 'user:slow', %s, 'image', 'ok')",
            (plane.acme,),
        )
        two = await _image(plane, plane.alice, plane.acme, "two")

        async def linked() -> dict[str | None, int | None]:
            return {e.resource_id: e.chain_seq for e in await _all(plane, plane.root, tenant=plane.acme)}

        # "one" began before the open transaction: it is linked once the database's other transactions end.
        async with asyncio.timeout(60):
            while (await linked())[one] is None:
                await link_audit(plane.compute.context)
                await asyncio.sleep(0.05)
        assert (await linked())[two] is None
        await conn.commit()
    await _link_all(plane)
    entries = await _all(plane, plane.root, tenant=plane.acme)
    slow = next(e for e in entries if e.actor == "user:slow")
    final = {e.resource_id: e.chain_seq for e in entries}
    after = final[two]
    assert slow.chain_seq is not None and after is not None and slow.chain_seq < after
    assert all(e.chain_seq is not None for e in entries)
    assert (await plane.audit.verify(plane.root, VerifyAuditInput(tenant=plane.acme))).ok
