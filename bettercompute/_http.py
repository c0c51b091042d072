"""The HTTP transport: a transport-neutral handler and the ASGI application around it.

Routes, below the endpoint (``/api/compute`` by default):

- ``POST /{group}/{method}``: a JSON object in, ``{"data": ...}`` or ``{"error": {...}}`` out;
- ``GET /openapi.json``: the OpenAPI 3.1 document generated from the registry;

and, for load balancers, unauthenticated ``GET /healthz`` (the process answers) and ``GET /readyz`` (it can serve:
the database answers).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from ._openapi import openapi_document
from .errors import ComputeError, InternalError, InvalidInputError, NotFoundError, UnauthenticatedError

if TYPE_CHECKING:
    from ._core import BetterCompute
    from ._dispatch import Dispatcher

__all__ = ["HttpTransport", "Request", "Response"]

log = logging.getLogger("bettercompute.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@attrs.frozen(kw_only=True)
class Request:
    """An HTTP request as the handler sees it. Header names are lower case."""

    method: str
    path: str
    headers: Mapping[str, str] = attrs.field(factory=dict)
    body: bytes = b""


@attrs.frozen(kw_only=True)
class Response:
    """An HTTP response."""

    status: int
    headers: Mapping[str, str] = attrs.field(factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        """The body, parsed."""
        return json.loads(self.body)


_JSON = {"content-type": "application/json", "cache-control": "no-store"}
_DISCONNECTED = b"\x00disconnected"  # a sentinel no real body is compared with by identity


def _json_response(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> Response:
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    return Response(status=status, headers={**_JSON, **(headers or {})}, body=body)


def error_response(
    error: ComputeError, *, status: int | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    """The envelope of a ``ComputeError``."""
    extra = dict(headers or {})
    if isinstance(error, UnauthenticatedError):
        extra.setdefault("www-authenticate", 'Bearer realm="better-compute"')
    return _json_response(status or error.http_status, error.to_envelope(), extra)


def _credential(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UnauthenticatedError("the Authorization header must be 'Bearer <credential>'")
    return token.strip()


class HttpTransport:
    """Routes requests to the dispatcher; the body limit and the in-flight cap live here."""

    def __init__(self, compute: BetterCompute, dispatcher: Dispatcher) -> None:
        self._compute = compute
        self._dispatcher = dispatcher
        self._prefix = compute.endpoint + "/"
        self._max_body = compute.options.max_body_bytes
        # Capping requests in flight keeps latency low under load: more piled up only wait on the database.
        self._limiter = anyio.CapacityLimiter(compute.max_in_flight)
        self._openapi: bytes | None = None

    async def handle(self, request: Request) -> Response:
        """Answer one request; never raises."""
        try:
            return await self._route(request)
        except ComputeError as exc:
            return error_response(exc)
        except Exception as exc:
            log.error("internal error in the HTTP handler: %s", type(exc).__name__)
            return error_response(InternalError("an internal error occurred"))

    async def _route(self, request: Request) -> Response:
        path = request.path
        if path == "/healthz":
            return _json_response(200, {"status": "ok"})
        if path == "/readyz":
            report = await self._compute.self_check()
            checks = {c.name: c.ok for c in report.checks}
            return _json_response(200 if report.status == "ok" else 503, {"status": report.status, "checks": checks})
        if not path.startswith(self._prefix):
            raise NotFoundError(f"no route for {path}", details={"path": path})
        rest = path[len(self._prefix) :]
        if rest == "openapi.json":
            if request.method not in ("GET", "HEAD"):
                return error_response(
                    InvalidInputError("use GET for the OpenAPI document"), status=405, headers={"allow": "GET"}
                )
            if self._openapi is None:
                document = openapi_document(self._compute.registry, self._compute.endpoint)
                self._openapi = json.dumps(document, separators=(",", ":")).encode()
            return Response(status=200, headers=dict(_JSON), body=self._openapi)
        group, _, name = rest.partition("/")
        method = self._compute.registry.method(group, name)
        if method is None:
            raise NotFoundError(f"no method {group}.{name}", details={"group": group, "method": name})
        if request.method != "POST":
            return error_response(
                InvalidInputError(f"use POST for {group}.{name}"), status=405, headers={"allow": "POST"}
            )
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if request.body and content_type != "application/json":
            return error_response(
                InvalidInputError("the body must be application/json", details={"content_type": content_type}),
                status=415,
            )
        if len(request.body) > self._max_body:
            return self._too_large()
        credential = _credential(request.headers)
        async with self._limiter:
            data = await self._dispatcher.call_json(method, credential, request.body)
        return _json_response(200, {"data": data})

    def _too_large(self) -> Response:
        return error_response(
            InvalidInputError(f"the body exceeds {self._max_body} bytes", details={"limit": self._max_body}),
            status=413,
        )

    # --- ASGI ---------------------------------------------------------------------------------------------------

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI 3 application."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        body = await self._read_body(headers, receive)
        if body is _DISCONNECTED:
            return  # the client left before its body arrived: nothing to run, nobody to answer
        if body is None:
            response = self._too_large()
        else:
            root = scope.get("root_path", "")
            path = scope["path"]
            if root and path.startswith(root):
                path = path[len(root) :]
            request = Request(method=scope["method"], path=path, headers=headers, body=body)
            response = await self.handle(request)
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()],
            }
        )
        await send({"type": "http.response.body", "body": response.body})

    async def _read_body(self, headers: Mapping[str, str], receive: Receive) -> bytes | None:
        """The whole body; ``None`` as soon as it is known to exceed the limit; ``_DISCONNECTED`` (that very object)
        when the client went away first."""
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body:
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return _DISCONNECTED
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self._compute.initialize()
                except ComputeError as exc:
                    await send({"type": "lifespan.startup.failed", "message": f"{exc.code}: {exc.message}"})
                    return
                except Exception as exc:
                    # A module's start() failing otherwise reads as "lifespan unsupported" and serves uninitialized.
                    log.error("initialize() failed: %s", type(exc).__name__)
                    await send({"type": "lifespan.startup.failed", "message": "INTERNAL: initialize() failed"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    await self._compute.close()
                except ComputeError as exc:
                    await send({"type": "lifespan.shutdown.failed", "message": f"{exc.code}: {exc.message}"})
                    return
                await send({"type": "lifespan.shutdown.complete"})
                return
