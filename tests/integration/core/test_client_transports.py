"""The typed client over the transports a user may hand it: in process over ASGI, HTTP/2 over TLS to a server that
speaks it (hypercorn; uvicorn speaks HTTP/1.1 only), and a Unix socket that uvicorn listens on (``--uds``). Each
test makes real calls and checks their answers; the HTTP/2 one also checks that every answer came over HTTP/2."""

from __future__ import annotations

import datetime as dt
import functools
import ipaddress
import shutil
import socket
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config as HypercornConfig
from hypercorn.typing import ASGIFramework, ASGIReceiveCallable, ASGISendCallable, Scope

from bettercompute.client import AsyncClient, Client
from bettercompute.errors import UnauthenticatedError
from bettercompute.modules.pools import CreatePoolInput, GetPoolInput

from .conftest import Plane

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def _whoami_and_a_pool(client: AsyncClient, name: str) -> str:
    """Ask who the credential is, make a pool and read it back; the pool's id."""
    who = await client.system.whoami()
    assert (who.principal_name, who.tenant_id, who.is_root) == ("root-admin", "root", True)
    created = await client.pools.create(CreatePoolInput(tenant="root", name=name))
    fetched = await client.pools.get(GetPoolInput(id=created.id))
    assert (fetched.id, fetched.name, fetched.tenant) == (created.id, name, "root")
    return created.id


async def test_in_process_over_asgi(plane: Plane) -> None:
    transport = httpx.ASGITransport(app=plane.compute.asgi)
    async with AsyncClient("http://compute", plane.root, transport=transport) as client:
        pool_id = await _whoami_and_a_pool(client, "asgi")
    async with AsyncClient("http://compute", "bcak_0000000000000000." + "A" * 43, transport=transport) as stranger:
        with pytest.raises(UnauthenticatedError):
            await stranger.system.whoami()
    # The same control plane as the process's own api: the pool is there.
    assert (await plane.compute.api.pools.get(plane.root, GetPoolInput(id=pool_id))).name == "asgi"


# --- HTTP/2 -------------------------------------------------------------------------------------------------------


def _tls_files(folder: Path) -> tuple[Path, Path, str]:
    """A server certificate for 127.0.0.1 and its key, as files, signed by a throw-away CA (PEM, for the client)."""
    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "transport test CA")])

    def issued(subject: x509.Name, public: ec.EllipticCurvePublicKey, *, ca: bool) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        )

    authority = issued(ca_name, ca_key.public_key(), ca=True).sign(ca_key, hashes.SHA256())
    loopback = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    server = (
        issued(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]), key.public_key(), ca=False)
        .add_extension(loopback, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_file, key_file = folder / "server.crt", folder / "server.key"
    cert_file.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file, authority.public_bytes(serialization.Encoding.PEM).decode()


def _lifespan_answered(app: ASGIFramework) -> ASGIFramework:
    """``app`` with the server's lifespan events answered here: the ``plane`` fixture, not the server, initializes
    and closes the control plane."""

    async def serve(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})

    return serve


async def test_http2_over_tls_to_a_server_that_speaks_it(plane: Plane, tmp_path: Path) -> None:
    cert_file, key_file, ca_pem = _tls_files(tmp_path)
    config = HypercornConfig()
    config.certfile, config.keyfile = str(cert_file), str(key_file)  # it offers h2 then http/1.1 by ALPN
    # Listening before the server starts: the client's connection waits in the backlog, nothing to poll for.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    config.bind = [f"fd://{listener.detach()}"]  # the server owns the socket from here on
    versions: list[str] = []

    async def record(response: httpx.Response) -> None:
        versions.append(response.http_version)

    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            functools.partial(
                hypercorn_serve, _lifespan_answered(plane.compute.asgi), config, shutdown_trigger=stop.wait
            )
        )
        try:
            # A client of the user's own making: HTTP/2 on, the test CA trusted, every answer's version recorded.
            verify = ssl.create_default_context(cadata=ca_pem)
            async with httpx.AsyncClient(http2=True, verify=verify, event_hooks={"response": [record]}) as http:
                async with AsyncClient(f"https://127.0.0.1:{port}", plane.root, http_client=http) as client:
                    await _whoami_and_a_pool(client, "over-h2")
                assert not http.is_closed  # the typed client leaves a client it was given open
        finally:
            stop.set()
    assert versions == ["HTTP/2"] * 3


async def test_a_transport_and_an_http_client_are_not_given_together() -> None:
    async with httpx.AsyncClient() as http:
        with pytest.raises(TypeError):
            AsyncClient("http://compute", transport=httpx.AsyncHTTPTransport(), http_client=http)
    with httpx.Client() as blocking, pytest.raises(TypeError):
        Client("http://compute", transport=httpx.HTTPTransport(), http_client=blocking)


# --- a Unix socket ------------------------------------------------------------------------------------------------


@pytest.fixture
def socket_path() -> Iterator[Path]:
    """A path for a Unix socket, short enough for ``sun_path`` (108 bytes) wherever the temporary folder is."""
    folder = tempfile.mkdtemp(prefix="bc-uds-")
    try:
        yield Path(folder) / "compute.sock"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def test_a_unix_socket_that_uvicorn_listens_on(plane: Plane, socket_path: Path) -> None:
    config = uvicorn.Config(
        plane.compute.asgi, uds=str(socket_path), lifespan="off", log_level="warning", http="h11", ws="none"
    )
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        try:
            while not server.started:  # noqa: ASYNC110 - uvicorn sets a flag once it listens, and has no event
                await anyio.sleep(0.01)
            # The URL's host is only the Host header: nothing listens on localhost's port 80.
            transport = httpx.AsyncHTTPTransport(uds=str(socket_path))
            async with AsyncClient("http://localhost", plane.root, transport=transport) as client:
                pool_id = await _whoami_and_a_pool(client, "over-uds")

            def blocking_get() -> str:
                with Client("http://localhost", plane.root, transport=httpx.HTTPTransport(uds=str(socket_path))) as c:
                    return c.pools.get(GetPoolInput(id=pool_id)).name

            # The blocking client, in a thread (the server runs on this event loop), through the same socket.
            assert await anyio.to_thread.run_sync(blocking_get) == "over-uds"
        finally:
            server.should_exit = True
