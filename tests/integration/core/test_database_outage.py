"""The database going away while the api serves: 503 UNAVAILABLE (retryable), then recovery once it is back."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.abc
import httpx
import pytest

from bettercompute import Options, better_compute
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def _pipe(source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream) -> None:
    try:
        async for chunk in source:
            await sink.send(chunk)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass
    finally:
        await sink.aclose()


@asynccontextmanager
async def tcp_proxy(port: int, target_host: str, target_port: int) -> AsyncIterator[None]:
    """A real TCP proxy on loopback; leaving the context cuts every connection, as a database outage would."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port, reuse_port=False)

    async def serve(client: anyio.abc.SocketStream) -> None:
        async with (
            client,
            await anyio.connect_tcp(target_host, target_port) as upstream,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(_pipe, client, upstream)
            tg.start_soon(_pipe, upstream, client)

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        try:
            yield
        finally:
            tg.cancel_scope.cancel()


def proxied_url(url: str, port: int) -> str:
    """``url`` pointed at a proxy on 127.0.0.1:``port``, keeping its user, password, database and query.

    The embedded server listens with a password, so dropping the userinfo would fail only where it runs.
    """
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}127.0.0.1:{port}"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_an_outage_is_503_and_the_api_recovers(database_url: str, fresh_schema: str) -> None:
    parts = urlsplit(database_url)
    assert parts.hostname and parts.port
    port = _free_port()
    via_proxy = proxied_url(database_url, port)
    iam = EmbeddedIam()
    compute = better_compute(Options(store=PgStore(via_proxy, schema=fresh_schema, pool_size=2), iam=iam))
    transport = httpx.ASGITransport(app=compute.asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        try:
            async with tcp_proxy(port, parts.hostname, parts.port):
                await compute.initialize()
                boot = await iam.bootstrap()
                assert boot.credential
            headers = {"authorization": f"Bearer {boot.credential}"}
            response = await http.post("/api/compute/system/version", headers=headers, json={})
            assert response.status_code == 503
            assert response.json()["error"] == {
                "code": "UNAVAILABLE",
                "message": "the database is unreachable",
                "details": {},
                "retryable": True,
            }
            ready = await http.get("/readyz")
            assert ready.status_code == 503
            async with tcp_proxy(port, parts.hostname, parts.port):
                response = await http.post("/api/compute/system/version", headers=headers, json={})
                assert response.status_code == 200
                assert (await http.get("/readyz")).status_code == 200
        finally:
            await compute.close()
