"""The control plane on real PostgreSQL: initialize, a real credential end to end, revocation, events, roles."""

from __future__ import annotations

import datetime as dt
import time

import anyio
import httpx
import psycopg
import pytest

from bettercompute import Options, better_compute
from bettercompute.client import AsyncClient
from bettercompute.errors import UnauthenticatedError, UnavailableError
from bettercompute.modules.system import VersionInput, WhoamiInput
from bettercompute.ports import OutboxEvent, StoredEvent
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore
from tests._timing import deadline

from .conftest import Plane

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


def _auth(credential: str) -> dict[str, str]:
    return {"authorization": f"Bearer {credential}"}


async def test_better_compute_does_no_io_and_initialize_reports_unavailable() -> None:
    # Nothing listens on port 1; constructing must still succeed, and only initialize() may notice.
    store = PgStore("postgresql://postgres:hunter2@127.0.0.1:1/nowhere")
    started = time.monotonic()
    compute = better_compute(Options(store=store, iam=EmbeddedIam()))
    assert time.monotonic() - started < 1
    with pytest.raises(UnavailableError) as info:
        await compute.initialize()
    assert info.value.code == "UNAVAILABLE"
    assert "hunter2" not in str(info.value) and "127.0.0.1" not in str(info.value)
    assert not compute.initialized
    await compute.close()


async def test_initialize_is_idempotent(plane: Plane) -> None:
    await plane.compute.initialize()
    assert await plane.compute.migrate() == {
        "runtime": [],
        "pools": [],
        "images": [],
        "commands": [],
        "usage": [],
        "capacity": [],
        "webhooks": [],
        "secrets": [],
        "nodes": [],
        "audit": [],
        "iam": [],
    }


async def test_a_bootstrapped_credential_calls_system_version_over_http(plane: Plane) -> None:
    response = await plane.http.post("/api/compute/system/version", headers=_auth(plane.root), json={})
    assert response.status_code == 200
    assert response.json()["data"]["version"] == "0.1.0"
    whoami = await plane.compute.api.system.whoami(plane.root, WhoamiInput())
    assert whoami.tenant_id == "root" and whoami.is_root and whoami.principal_name == "root-admin"


async def test_the_typed_client_sees_the_same_errors(plane: Plane) -> None:
    transport = httpx.ASGITransport(app=plane.compute.asgi)
    async with AsyncClient("http://test", plane.root, transport=transport) as client:
        assert (await client.system.version()).version == "0.1.0"
        assert (await client.system.health()).status == "ok"
    async with AsyncClient("http://test", "bcak_0000000000000000." + "A" * 43, transport=transport) as client:
        with pytest.raises(UnauthenticatedError):
            await client.system.version(VersionInput())


async def test_bootstrap_twice_mints_one_credential_unless_rotated(plane: Plane) -> None:
    again = await plane.iam.bootstrap()
    assert again.credential is None
    rotated = await plane.iam.bootstrap(rotate=True)
    assert rotated.credential is not None and rotated.revoked
    # The old credential stops working in this process at once, despite the authentication cache.
    with pytest.raises(UnauthenticatedError):
        await plane.compute.api.system.version(plane.root, VersionInput())
    assert (await plane.compute.api.system.version(rotated.credential, VersionInput())).version


async def test_a_revoked_credential_is_refused_at_once(plane: Plane) -> None:
    await plane.compute.api.system.version(plane.root, VersionInput())  # now cached
    credential_id = plane.root.split("_", 1)[1].split(".")[0]
    assert await plane.iam.revoke(credential_id)
    response = await plane.http.post("/api/compute/system/version", headers=_auth(plane.root), json={})
    assert response.status_code == 401


async def test_a_credential_with_a_wrong_secret_is_refused(plane: Plane) -> None:
    forged = plane.root[:-4] + ("AAAA" if not plane.root.endswith("AAAA") else "BBBB")
    response = await plane.http.post("/api/compute/system/version", headers=_auth(forged), json={})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "UNAUTHENTICATED"


async def test_no_table_holds_the_credential_secret(plane: Plane, database_url: str, fresh_schema: str) -> None:
    secret = plane.root.split(".", 1)[1]
    with psycopg.connect(database_url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (fresh_schema,)
        ).fetchall()
        for (table,) in tables:
            dump = conn.execute(f'SELECT t::text FROM "{fresh_schema}"."{table}" t').fetchall()
            assert not any(secret in row[0] for row in dump), table
            assert not any(plane.root in row[0] for row in dump), table


async def test_events_reach_subscribers_only_after_commit(plane: Plane) -> None:
    seen: list[StoredEvent] = []

    async def subscriber(event: StoredEvent) -> None:
        seen.append(event)

    plane.compute.events.subscribe(subscriber, types={"thing.changed"})
    with pytest.raises(RuntimeError):
        async with plane.store.transaction() as tx:
            await tx.publish([OutboxEvent(type="thing.changed", key="t1", payload={"n": 0})])
            raise RuntimeError("roll back")
    async with plane.store.transaction() as tx:
        await tx.publish([OutboxEvent(type="thing.changed", key="t1", payload={"n": 1})])
        await tx.publish([OutboxEvent(type="other", key="t1", payload={})])
    await plane.compute.jobs.tick()
    await plane.compute.jobs.tick()
    assert [e.payload for e in seen] == [{"n": 1}]


async def test_roles_run_under_leases_and_stop_hands_them_back(plane: Plane) -> None:
    delivered = anyio.Event()

    async def subscriber(event: StoredEvent) -> None:
        delivered.set()

    plane.compute.events.subscribe(subscriber)
    await plane.compute.start({"sinks"})
    try:
        async with plane.store.transaction() as tx:
            await tx.publish([OutboxEvent(type="x", key="k", payload={})])
        with anyio.fail_after(deadline(10)):
            await delivered.wait()
        lease = await plane.store.leases.get("sinks/events")
        assert lease is not None and lease.holder == "test-1"
    finally:
        await plane.compute.stop()
    assert await plane.store.leases.get("sinks/events") is None


async def test_unknown_roles_are_refused(plane: Plane) -> None:
    with pytest.raises(Exception, match="unknown worker roles"):
        await plane.compute.start({"gardening"})


async def test_the_clock_is_anchored_to_the_database(plane: Plane) -> None:
    database_now = await plane.store.now()
    assert abs(plane.compute.context.clock.now() - database_now) < dt.timedelta(seconds=2)


async def test_stop_may_come_from_another_task_than_start(plane: Plane) -> None:
    # An ASGI server's lifespan shutdown or a signal handler stops what the host's main task started.
    async with anyio.create_task_group() as tg:
        tg.start_soon(plane.compute.start, {"sinks"})
    assert (await plane.store.leases.get("sinks/events")) is not None
    async with anyio.create_task_group() as tg:
        tg.start_soon(plane.compute.stop)
    assert await plane.store.leases.get("sinks/events") is None


async def test_run_is_the_structured_form(plane: Plane) -> None:
    async with anyio.create_task_group() as tg:
        await tg.start(plane.compute.run, {"sinks"})
        assert (await plane.store.leases.get("sinks/events")) is not None
        tg.cancel_scope.cancel()
    assert await plane.store.leases.get("sinks/events") is None
