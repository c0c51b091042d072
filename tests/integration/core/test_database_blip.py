"""A short database outage (a restart) costs seconds: no stale connection fails a request, no job loses its lease."""

from __future__ import annotations

import contextlib
import datetime as dt
import socket
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import attrs
import httpx
import psycopg
import pytest

from bettercompute import BetterCompute, Job, ModuleContext, Options, better_compute
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore
from tests._timing import deadline

from .test_database_outage import tcp_proxy

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _proxied(url: str, port: int) -> str:
    """``url`` pointed at the proxy on ``port``, with its user and password (the embedded server wants one)."""
    parts = urlsplit(url)
    userinfo, _, _ = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"))


def _target(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname
    return parts.hostname, parts.port or 5432


async def test_after_a_restart_while_idle_the_first_requests_succeed(database_url: str, fresh_schema: str) -> None:
    port = _free_port()
    host, target_port = _target(database_url)
    iam = EmbeddedIam()
    store = PgStore(_proxied(database_url, port), schema=fresh_schema, pool_size=4)
    compute = better_compute(Options(store=store, iam=iam))
    transport = httpx.ASGITransport(app=compute.asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        try:
            async with tcp_proxy(port, host, target_port):
                await compute.initialize()
                boot = await iam.bootstrap()
                headers = {"authorization": f"Bearer {boot.credential}"}
                body = {"tenant": boot.tenant_id}
                assert (await http.post("/api/compute/pools/list", headers=headers, json=body)).status_code == 200
                # Open every connection of the pool, so that all of them sit idle when the database restarts.
                async with contextlib.AsyncExitStack() as stack:
                    for _ in range(4):
                        await stack.enter_async_context(store.connection())
            # The proxy closed every connection, as a restart does; the api saw nothing, being idle.
            async with tcp_proxy(port, host, target_port):
                compute.caches.invalidate_all()  # an idle api's cached authentications have expired too
                for _ in range(6):
                    response = await http.post("/api/compute/pools/list", headers=headers, json=body)
                    assert response.status_code == 200, response.json()
                    assert (await http.get("/readyz")).status_code == 200
        finally:
            await compute.close()


@attrs.frozen(kw_only=True)
class _ProbeModule:
    """A module with one singleton job (interval 30 s, like the IAM's): each pass records when it ran, waits for
    ``go``, then asks the database."""

    passes: list[float]
    go: anyio.Event
    name: str = "probe"
    version: str = "0.1.0"
    core_range: str = ">=0.1"
    groups: Sequence[Any] = ()
    actions: Sequence[str] = ()
    migrations: Any = attrs.field(factory=dict)

    @property
    def jobs(self) -> Sequence[Job]:
        return (Job(name="probe", role="iam", interval=dt.timedelta(seconds=30), run=self._pass),)

    async def _pass(self, context: ModuleContext) -> int:
        self.passes.append(anyio.current_time())
        await self.go.wait()
        await context.store.now()
        return 1

    async def start(self, context: ModuleContext) -> None:
        return None

    async def stop(self) -> None:
        return None


async def _until(condition: Callable[[], bool], *, within: float) -> None:
    """Wait, at most ``within`` seconds, for ``condition`` to hold (polled: a job pass sets no event here)."""
    with anyio.fail_after(deadline(within)):
        while not condition():  # noqa: ASYNC110 - the passes are recorded by another plane's loop
            await anyio.sleep(0.1)


def _leases(url: str, schema: str, names: Sequence[str]) -> dict[str, tuple[str, int]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            f'SELECT name, holder, token FROM "{schema}".leases WHERE name = ANY(%s) AND expires_at > now()',
            (list(names),),
        ).fetchall()
    return {name: (holder, token) for name, holder, token in rows}


async def test_a_blip_costs_a_singleton_job_seconds_and_not_its_lease(database_url: str, fresh_schema: str) -> None:
    port = _free_port()
    host, target_port = _target(database_url)
    ttl = dt.timedelta(seconds=9)
    names = ["iam/probe", "iam/expire-credentials"]
    passes: list[float] = []
    go = anyio.Event()
    other_go = anyio.Event()
    other_go.set()

    def plane(url: str, instance: str, probe: _ProbeModule) -> BetterCompute:
        store = PgStore(url, schema=fresh_schema, pool_size=4)
        return better_compute(
            Options(store=store, iam=EmbeddedIam(), modules=[probe], instance=instance, lease_ttl=ttl)
        )

    # "a" reaches the database through the proxy; "b" directly, and takes over any lease "a" lets lapse.
    a = plane(_proxied(database_url, port), "blip-a", _ProbeModule(passes=passes, go=go))
    b = plane(database_url, "blip-b", _ProbeModule(passes=[], go=other_go))
    try:
        async with tcp_proxy(port, host, target_port):
            await a.start({"iam"})
            await _until(lambda: bool(passes), within=30)
            await b.start({"iam"})
            before = _leases(database_url, fresh_schema, names)
            assert {holder for holder, _ in before.values()} == {"blip-a"}, before
        # The blip: every connection closed, new ones refused. The probe's pass meets it and fails.
        go.set()
        await anyio.sleep(2)
        async with tcp_proxy(port, host, target_port):
            restored = anyio.current_time()
            # The failed pass runs again as soon as the database is back, not after a backoff of twice its interval.
            await _until(lambda: passes[-1] > restored, within=20)
            # Past the TTL counted from the blip, a lease not renewed meanwhile would have gone to "b".
            await anyio.sleep(ttl.total_seconds())
            assert _leases(database_url, fresh_schema, names) == before
            await a.stop()
    finally:
        await b.close()
        await a.close()
