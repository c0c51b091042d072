"""A small HTTPS server that answers Redfish paths with whatever a test tells it to, and records every request.

The emulator is a well-behaved BMC; this server plays the others: one that sends HTML, megabytes, JSON of the wrong
shape, redirects, links to other hosts, or drips its body a byte at a time. It also proves what reached a server:
``requests`` holds every request that was read (method, path, headers, body), ``connections`` counts the TCP
connections accepted and ``handshakes`` the TLS handshakes completed on its side.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs

from tests._timing import deadline

from ._bmc import TestCertificates, make_certificates


@attrs.frozen
class Reply:
    """An answer: ``body`` is sent as is when bytes, as JSON otherwise.

    ``length=False`` sends no ``Content-Length`` and closes the connection after the body; ``drip`` sends the body
    one byte at a time with that many seconds between bytes.
    """

    body: Any = b""
    status: int = 200
    headers: Mapping[str, str] = attrs.field(factory=dict)
    length: bool = True
    drip: float = 0.0

    def payload(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


@attrs.frozen
class Recorded:
    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeBmc

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The handshake runs here, in the connection's thread, so a client that aborts it stops only this thread.
        if self.fake.context is None:
            super().finish_request(request, client_address)
            return
        with self.fake.lock:
            self.fake.connections += 1
        # wrap_socket takes the socket over (the server's own close of it then does nothing): close what it made.
        with self.fake.context.wrap_socket(request, server_side=True) as tls:
            with self.fake.lock:
                self.fake.handshakes += 1
            super().finish_request(tls, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # A client that hangs up (a refused pin, a body too large) is what several tests are about.


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with fake.lock:
            fake.requests.append(Recorded(self.command, self.path, dict(self.headers.items()), body))
        reply = fake.routes.get(self.path.rstrip("/") or "/", Reply({"error": {"message": "no such path"}}, 404))
        payload = reply.payload()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.length:
            self.send_header("Content-Length", str(len(payload)))
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if reply.drip:
            for index in range(len(payload)):
                self.wfile.write(payload[index : index + 1])
                self.wfile.flush()
                time.sleep(reply.drip)
        else:
            self.wfile.write(payload)

    do_GET = do_POST = do_PATCH = _answer


class FakeBmc:
    """The server's state; start it with ``serve_fake_bmc``."""

    def __init__(self, routes: Mapping[str, Reply], certs: TestCertificates | None) -> None:
        self.routes = dict(routes)
        self.certs = certs
        self.context: ssl.SSLContext | None = None
        if certs is not None:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(certs.cert_file, certs.key_file)
        self.requests: list[Recorded] = []
        self.connections = 0
        self.handshakes = 0
        self.lock = threading.Lock()
        self.url = ""


@contextmanager
def serve_fake_bmc(
    folder: Path, routes: Mapping[str, Reply], *, plain: bool = False, names: tuple[str, ...] = ("127.0.0.1",)
) -> Iterator[FakeBmc]:
    """Serve ``routes`` on a free loopback port (HTTPS with a fresh certificate for ``names``, or plain HTTP)."""
    certs = None if plain else make_certificates(folder, names=names)
    fake = FakeBmc(routes, certs)
    server = _Server(("127.0.0.1", 0), _Handler)
    server.fake = fake
    port = server.server_address[1]
    fake.url = f"{'http' if plain else 'https'}://127.0.0.1:{port}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=deadline(5))
