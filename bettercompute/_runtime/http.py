"""The HTTP transport: a transport-neutral handler and the ASGI application around it.

Routes, below the endpoint (``/api/compute`` by default):

- ``POST /{group}/{method}``: a JSON object in, ``{"data": ...}`` or ``{"error": {...}}`` out;
- ``GET /openapi.json``: the OpenAPI 3.1 document generated from the registry;

and, for load balancers, unauthenticated ``GET /healthz`` (the process answers) and ``GET /readyz`` (it can serve:
the database answers); for Prometheus, unauthenticated ``GET /metrics`` (aggregate counters with bounded labels only,
see ``_runtime.metrics``). Every response that goes out through the ASGI app is counted there, by method and code.

Method calls go through ``LoadShedder`` (``shedding.py``): ``max_in_flight`` run, ``max_queued`` wait, the rest are
answered at once with ``503 UNAVAILABLE`` and ``Retry-After``. Nothing else is ever shed: the health endpoints, the
OpenAPI document and answers that need no call (404, 405, 413, 415) do not take a slot.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import attrs

from bettercompute._runtime.codec import quote
from bettercompute._runtime.metrics import CONTENT_TYPE, http_method_label
from bettercompute._runtime.openapi import openapi_document
from bettercompute._runtime.shedding import OVERLOADED, PRESENCE, RETRY_AFTER_SECONDS, LoadShedder, Presence
from bettercompute.errors import (
    ComputeError,
    InternalError,
    InvalidInputError,
    NotFoundError,
    UnauthenticatedError,
    UnavailableError,
)

if TYPE_CHECKING:
    from bettercompute._runtime.dispatch import Dispatcher
    from bettercompute._runtime.health import HealthOutput
    from bettercompute._runtime.metrics import Metrics
    from bettercompute._runtime.registry import Registry

__all__ = ["HttpTransport", "Request", "Response"]

log = logging.getLogger("bettercompute.http")


class Served(Protocol):
    """What the HTTP transport needs of the control plane it serves (``BetterCompute``)."""

    @property
    def endpoint(self) -> str: ...
    @property
    def registry(self) -> Registry: ...
    @property
    def max_in_flight(self) -> int: ...
    @property
    def max_queued(self) -> int: ...
    @property
    def max_body_bytes(self) -> int: ...
    @property
    def metrics(self) -> Metrics: ...

    async def self_check(self) -> HealthOutput: ...
    async def initialize(self) -> None: ...
    async def close(self) -> None: ...


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
_SHED_LOG_SECONDS = 10.0  # under overload, one log line this often rather than one per shed call


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


def response_code(response: Response) -> str:
    """The ``code`` label of a response: ``OK`` below 400, else the error code of its envelope; a response without
    one (``/readyz`` answering 503) reads ``UNAVAILABLE`` for 503, ``HTTP_<status>`` otherwise."""
    if response.status < 400:
        return "OK"
    try:
        code = json.loads(response.body)["error"]["code"]
    except Exception:
        code = None
    # Codes come from the server's own errors, but a plugin's error class could carry anything: keep it bounded.
    if isinstance(code, str) and 0 < len(code) <= 48 and code.replace("_", "").isalnum() and code.isupper():
        return code
    return "UNAVAILABLE" if response.status == 503 else f"HTTP_{response.status}"


def _credential(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    token = token.strip()
    # A credential is visible ASCII (RFC 6750's token68); anything else could only reach the store as a lookup
    # key it cannot hold (a NUL) or match.
    if scheme.lower() != "bearer" or not token or not all("!" <= c <= "~" for c in token):
        raise UnauthenticatedError("the Authorization header must be 'Bearer <credential>'")
    return token


# The request headers the app reads, each of which has one meaning only when it is given once.
_SINGLE_HEADERS = frozenset({"authorization", "content-type", "content-length", "idempotency-key"})


def _headers(raw: Any) -> tuple[dict[str, str], str | None]:
    """The headers by lower-case name, and the first single-valued one (``_SINGLE_HEADERS``) given twice, if any."""
    headers: dict[str, str] = {}
    repeated: str | None = None
    for key, value in raw:
        name = key.decode("latin-1").lower()
        if name in headers and name in _SINGLE_HEADERS and repeated is None:
            repeated = name
        headers[name] = value.decode("latin-1")
    return headers, repeated


def _route_path(scope: Scope) -> str:
    """The path to route on, below ``root_path``: the raw path as the client sent it, when the server gives it.

    Servers hand the app ``path`` percent-decoded, so ``pools%2Fcreate`` would read as ``pools/create``. Routing on the
    raw bytes keeps every escape as it was sent, and as no route holds a ``%``, an escaped path matches nothing.
    """
    raw = scope.get("raw_path")
    # Some clients' ASGI transports (httpx's) leave the query string on the raw path; the spec says it has none.
    path = bytes(raw).split(b"?", 1)[0].decode("latin-1") if isinstance(raw, bytes | bytearray) else scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return str(path)


async def _send(send: Send, response: Response) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": response.status,
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()],
        }
    )
    await send({"type": "http.response.body", "body": response.body})


async def _watch(receive: Receive, presence: Presence) -> None:
    """Wait for the client to disconnect. The body has been read, so the next message is ``http.disconnect``; a
    server that sends something else gets no more watching."""
    if (await receive())["type"] == "http.disconnect":
        presence.leave()


class AsgiApp:
    """The ASGI 3 application, as an object whose ``__call__`` is a coroutine function: servers that guess the
    interface (uvicorn's default) take a bound method for ASGI 2, so ``compute.asgi`` is one of these instead."""

    __slots__ = ("_transport",)

    def __init__(self, transport: HttpTransport) -> None:
        self._transport = transport

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._transport.asgi(scope, receive, send)


class HttpTransport:
    """Routes requests to the dispatcher; the body limit and the load shedder (``shedder``) live here."""

    def __init__(self, compute: Served, dispatcher: Dispatcher) -> None:
        self._compute = compute
        self._dispatcher = dispatcher
        self._prefix = compute.endpoint + "/"
        self._max_body = compute.max_body_bytes
        # Capping requests in flight keeps latency low under load: more piled up only wait on the database. Bounding
        # the queue in front keeps it low under overload: the calls past it are shed (shedding.py says why).
        self.shedder = LoadShedder(compute.max_in_flight, compute.max_queued)
        # One answer for every shed call, made once: shedding must cost less than the calls it protects.
        self._shed = error_response(
            UnavailableError(
                f"the server is at capacity and did not run the call; retry after {RETRY_AFTER_SECONDS} s",
                details={"reason": OVERLOADED, "retry_after": RETRY_AFTER_SECONDS},
            ),
            headers={"retry-after": str(RETRY_AFTER_SECONDS)},
        )
        self._shed_logged_at = -_SHED_LOG_SECONDS
        self._openapi: bytes | None = None
        self.app = AsgiApp(self)

    async def handle(self, request: Request) -> Response:
        """Answer one request; never raises."""
        error: ComputeError
        try:
            return await self._route(request)
        except ComputeError as exc:
            error = exc
        except Exception as exc:
            log.error("internal error in the HTTP handler: %s", type(exc).__name__)
            error = InternalError("an internal error occurred")
        try:
            return error_response(error)
        except Exception as exc:
            # An error whose text or details cannot be sent (as JSON, in UTF-8): say less rather than fail.
            log.error("could not encode a %s envelope: %s", error.code, type(exc).__name__)
            return error_response(InternalError("an internal error occurred"))

    async def _route(self, request: Request) -> Response:
        path = request.path
        if path == "/healthz":
            return _json_response(200, {"status": "ok"})
        if path == "/metrics":
            return self._metrics(request)
        if path == "/readyz":
            report = await self._compute.self_check()
            checks = {c.name: c.ok for c in report.checks}
            return _json_response(200 if report.status == "ok" else 503, {"status": report.status, "checks": checks})
        if not path.startswith(self._prefix):
            raise NotFoundError(f"no route for {quote(path)}", details={"path": quote(path, limit=256)})
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
            group, name = quote(group), quote(name)
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
        key = request.headers.get("idempotency-key")
        if not await self.shedder.acquire():
            return self._overloaded()
        try:
            data = await self._dispatcher.call_json(method, credential, request.body, idempotency_key=key)
        finally:
            self.shedder.release()
        return _json_response(200, {"data": data})

    def _metrics(self, request: Request) -> Response:
        """The exposition text; a failure to render is an ``INTERNAL`` envelope (from ``handle``), never a trace."""
        if request.method not in ("GET", "HEAD"):
            return error_response(InvalidInputError("use GET for /metrics"), status=405, headers={"allow": "GET"})
        body = self._compute.metrics.render()
        return Response(status=200, headers={"content-type": CONTENT_TYPE, "cache-control": "no-store"}, body=body)

    def _record(self, path: str, started: float, response: Response) -> None:
        """Count one answered request (an in-memory increment: no statement, no I/O)."""
        try:
            registry = self._compute.registry
            method = http_method_label(
                path, self._compute.endpoint, lambda group, name: registry.method(group, name) is not None
            )
            metrics = self._compute.metrics
            metrics.http_requests.labels(method, response_code(response)).inc()
            metrics.http_duration.labels(method).observe(time.perf_counter() - started)
        except Exception as exc:  # counting must never cost the response
            log.warning("could not record a request's metrics: %s", type(exc).__name__)

    def _overloaded(self) -> Response:
        """The shed answer; a warning now and then, not one line per call, when the log is the last thing to flood."""
        now = time.monotonic()
        if now - self._shed_logged_at >= _SHED_LOG_SECONDS:
            self._shed_logged_at = now
            a = self.shedder
            log.warning(
                "shedding load: %d calls running (max_in_flight) and %d waiting (max_queued); %d shed since start",
                a.in_flight,
                a.waiting,
                a.shed,
            )
        return self._shed

    def _too_large(self) -> Response:
        return error_response(
            InvalidInputError(f"the body exceeds {self._max_body} bytes", details={"limit": self._max_body}),
            status=413,
        )

    # --- ASGI ---------------------------------------------------------------------------------------------------

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI 3 application. No exception leaves it: the server would answer with a plain-text page."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self._http(scope, receive, tracked_send)
        except Exception as exc:
            # Only the class: the text may quote the request. Once the response has started nothing more can be
            # said on it; the server closes the connection when the app returns.
            log.error("internal error in the ASGI app: %s", type(exc).__name__)
            if not started:
                with contextlib.suppress(Exception):
                    await _send(send, error_response(InternalError("an internal error occurred")))

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        headers, repeated = _headers(scope.get("headers", []))
        if self.shedder.full and not repeated:
            # A call arriving now is shed, and nothing else needs the body (health, OpenAPI, 404 and 405 are the
            # same without it): answer before reading it. There is no await between here and the admission.
            request = Request(method=scope["method"], path=_route_path(scope), headers=headers)
            shed = await self.handle(request)
            self._record(request.path, started, shed)
            await _send(send, shed)
            return
        body = await self._read_body(headers, receive)
        if body is _DISCONNECTED:
            return  # the client left before its body arrived: nothing to run, nobody to answer
        response: Response | None
        if body is None:
            response = self._too_large()
        elif repeated:
            # Two values of a header the app reads: which one a proxy in front acted on is unknowable.
            response = error_response(
                InvalidInputError(f"the {repeated} header is given more than once", details={"header": repeated})
            )
        else:
            request = Request(method=scope["method"], path=_route_path(scope), headers=headers, body=body)
            if self.shedder.busy:
                response = await self._handle_watched(request, receive)
            else:
                response = await self.handle(request)
        if response is not None:  # None: the client left while its call waited, nobody to answer
            self._record(_route_path(scope), started, response)
            await _send(send, response)

    async def _handle_watched(self, request: Request, receive: Receive) -> Response | None:
        """``handle``, for a call that may wait for a slot, watching for its client to leave meanwhile (a waiting
        call then gives its place up); ``None`` when the client left."""
        presence = Presence()
        token = PRESENCE.set(presence)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_watch, receive, presence)
                response = await self.handle(request)
                tg.cancel_scope.cancel()
        finally:
            PRESENCE.reset(token)
        return None if presence.left else response

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
                except Exception as exc:
                    log.error("close() failed: %s", type(exc).__name__)
                    await send({"type": "lifespan.shutdown.failed", "message": "INTERNAL: close() failed"})
                    return
                await send({"type": "lifespan.shutdown.complete"})
                return
