"""``better-compute mcp``: every method of a control plane as an MCP tool, over stdio or streamable HTTP.

The tools are made from the control plane's OpenAPI document (itself generated from the registry), so a method
declared once is a tool too, a module's groups included: one tool per method, named ``<group>_<method>`` (group and
method names never hold ``_``, so the name splits back one way: ``reservations_create``, ``join-tokens_create``),
described by the method's summary, its input schema the method's input as JSON Schema with every definition it uses
under ``$defs``, its output schema HTTP's ``{"data": <output>}`` (which ``mcp.Client`` checks answers against). A
mutating tool also takes ``idempotency_key`` (unless its input has a field of that name), sent as
the ``Idempotency-Key`` header: a retry with the same key and arguments replays the first answer. MCP has no hint
for "idempotent when given a key", so ``idempotentHint`` is left false and the description says it instead.

A tool call is an HTTP-shaped exchange with the control plane (``ControlPlane``): ``POST {endpoint}/{group}/{method}``
with the credential and the key, through the same handler and dispatcher as any HTTP caller, so authentication,
IAM decisions, the audit, idempotency and the error mapping all apply. Two planes implement it:

- ``InProcess(compute)``: the ``BetterCompute`` object's own transport-neutral handler, in this process (tests,
  a host that mounts ``streamable_http_app`` next to ``compute.asgi``);
- ``Remote(url)``: a served control plane over HTTP (``better-compute mcp --server URL``), whose OpenAPI document
  also lists the groups of modules this command does not know.

A tool answers what HTTP would: ``{"data": ...}``, or an MCP tool error (``isError``) whose content is the error
envelope ``{"error": {"code", "message", "details", "retryable"}}`` with a code from ``bettercompute.errors``; an
unknown tool is ``NOT_FOUND``, arguments that do not fit are ``INVALID_INPUT``. No traceback leaves this module.

The credential: on stdio the one given at start (``serve_stdio``); over streamable HTTP the bearer token of each
HTTP request, never one shared by the process (``streamable_http_app`` answers 401 to a request without one).
"""

from __future__ import annotations

import copy
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import attrs
import httpx
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, CallToolResult, InputRequiredResult, TextContent, Tool, ToolAnnotations
from starlette.applications import Starlette

from bettercompute.errors import (
    ComputeError,
    InternalError,
    InvalidInputError,
    NotFoundError,
    UnauthenticatedError,
    UnavailableError,
)

from ._signals import no_signal_reraise
from ._version import __version__

if TYPE_CHECKING:
    from bettercompute import BetterCompute

__all__ = [
    "ENDPOINT",
    "ComputeMcp",
    "ControlPlane",
    "InProcess",
    "Remote",
    "ToolSpec",
    "serve_http",
    "serve_stdio",
    "streamable_http_app",
    "tool_name",
    "tools_from_openapi",
]

log = logging.getLogger("bettercompute.mcp")

ENDPOINT = "/api/compute"
"""Where a served control plane's methods are (``Options.endpoint``'s default)."""

_KEY = "idempotency_key"
_KEY_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": "^[!-~]{1,255}$",
    "description": "Makes a retry safe: the same key with the same arguments replays the first answer instead of "
    "acting twice (kept 24 hours, per caller); the same key with other arguments is CONFLICT.",
}
_KEY_PATTERN = re.compile(r"[!-~]{1,255}")
_TOKEN = re.compile(r"[!-~]+")
# Mutations that only add something; every other mutating method is marked destructive (MCP's default for a tool
# that is not read-only), so a client that confirms destructive calls asks before a cancel, a revoke, an update.
_ADDITIVE = frozenset({"create", "test"})
_TIMEOUT = httpx.Timeout(60.0, connect=5.0)


# --- the control plane, in this process or over HTTP --------------------------------------------------------------


class ControlPlane(Protocol):
    """Where tool calls go: one HTTP exchange below the endpoint (``/openapi.json``, ``/{group}/{method}``).

    Implementations answer the status and body the control plane gave, and raise ``UnavailableError`` only when it
    could not be reached at all.
    """

    async def exchange(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, bytes]:
        """Send one request; its status and body."""
        ...


@attrs.frozen
class InProcess:
    """A ``BetterCompute`` object in this process, through its transport-neutral handler (the HTTP path, minus the
    socket): the same routing, body limit, in-flight cap, dispatcher and envelopes as an HTTP caller gets."""

    compute: BetterCompute

    async def exchange(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, bytes]:
        """Answer through ``compute.handler``."""
        from bettercompute import Request  # loaded with the object itself; ``mcp --server`` never needs it

        request = Request(method=method, path=f"{self.compute.endpoint}{path}", headers=dict(headers), body=body)
        response = await self.compute.handler(request)
        return response.status, response.body


class Remote:
    """A control plane served at ``url`` (``http://host:port``), over HTTP."""

    def __init__(self, url: str, *, http: httpx.AsyncClient | None = None) -> None:
        self.url = url.rstrip("/")
        self._http = http or httpx.AsyncClient(timeout=_TIMEOUT)
        self._owned = http is None

    async def exchange(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, bytes]:
        """Send it; ``UnavailableError`` when the server cannot be reached."""
        try:
            response = await self._http.request(method, f"{self.url}{ENDPOINT}{path}", headers=headers, content=body)
        except httpx.HTTPError as exc:
            # Only the class: the text of a connection error may name internal hosts.
            raise UnavailableError(f"cannot reach {self.url} ({type(exc).__name__})") from None
        return response.status_code, response.content

    async def aclose(self) -> None:
        """Close the HTTP client this plane made."""
        if self._owned:
            await self._http.aclose()


# --- tools from the OpenAPI document ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ToolSpec:
    """One method as a tool: the MCP ``tool`` and what calling it needs."""

    tool: Tool
    path: str
    """Below the endpoint: ``/{group}/{method}``."""
    mutates: bool
    key_argument: bool
    """Whether ``idempotency_key`` is this tool's own argument (sent as the header) rather than an input field."""


def tool_name(group: str, method: str) -> str:
    """``<group>_<method>``: legal for MCP and for the model APIs (letters, digits, ``-``, ``_``)."""
    return f"{group}_{method}"


def _self_contained(schema: Mapping[str, Any], components: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``#/components/schemas/X`` references turned into ``#/$defs/X`` and every definition it
    reaches (and nothing else) under ``$defs``; a root that is only a reference is replaced by what it names."""
    prefix = "#/components/schemas/"
    defs: dict[str, Any] = {}

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {key: walk(value) for key, value in node.items() if key != "$ref"}
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(prefix):
            name = ref[len(prefix) :]
            if name not in defs:
                defs[name] = {}  # reserved first: a definition may refer to itself
                defs[name] = walk(components.get(name, {}))
            out["$ref"] = f"#/$defs/{name}"
        elif ref is not None:
            out["$ref"] = ref
        return out

    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith(prefix) and len(schema) == 1:
        root = walk(copy.deepcopy(components.get(ref[len(prefix) :], {})))
    else:
        root = walk(schema)
    if not isinstance(root, dict):
        root = {}
    root.setdefault("type", "object")  # MCP requires an object at the root
    if defs:
        root["$defs"] = defs
    return root


def tools_from_openapi(document: Mapping[str, Any], endpoint: str = ENDPOINT) -> dict[str, ToolSpec]:
    """One tool per ``POST`` operation below ``endpoint`` of an OpenAPI document made by ``openapi_document``, by
    tool name."""
    components = document.get("components", {}).get("schemas", {})
    found: dict[str, ToolSpec] = {}
    for route, item in sorted(document.get("paths", {}).items()):
        operation = item.get("post") if isinstance(item, dict) else None
        if not isinstance(operation, dict) or not route.startswith(endpoint + "/"):
            continue
        path = route[len(endpoint) :]
        group, _, method = path[1:].partition("/")
        if not group or not method or "/" in method:
            continue
        body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
        schema = _self_contained(body, components)
        ok = operation.get("responses", {}).get("200", {}).get("content", {}).get("application/json", {})
        output = _self_contained(ok["schema"], components) if isinstance(ok.get("schema"), dict) else None
        mutates = bool(operation.get("x-mutates", True))  # unknown: treat as a change, the cautious reading
        properties = schema.setdefault("properties", {})
        key_argument = mutates and _KEY not in properties
        summary = str(operation.get("summary") or f"{group} {method}")
        if mutates:
            summary += (
                " Changes state: pass idempotency_key to make a retry safe (the same key and arguments act once)."
            )
        if key_argument:
            properties[_KEY] = dict(_KEY_SCHEMA)
        name = tool_name(group, method)
        tool = Tool(
            name=name,
            title=f"{group} {method}",
            description=summary,
            input_schema=schema,
            output_schema=output,
            annotations=ToolAnnotations(
                title=f"{group} {method}",
                read_only_hint=not mutates,
                destructive_hint=None if not mutates else method not in _ADDITIVE,
                idempotent_hint=None if not mutates else False,
            ),
        )
        found[name] = ToolSpec(tool=tool, path=path, mutates=mutates, key_argument=key_argument)
    return found


# --- the server ---------------------------------------------------------------------------------------------------


def _answer(envelope: Mapping[str, Any], *, error: bool) -> CallToolResult:
    text = json.dumps(envelope, separators=(",", ":"), ensure_ascii=False)
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=dict(envelope), is_error=error
    )


def _failure(error: ComputeError) -> CallToolResult:
    return _answer(error.to_envelope(), error=True)


def _bearer(headers: Mapping[str, str] | None) -> str | None:
    """The credential of ``Authorization: Bearer <credential>``; ``None`` without the header.

    Raises:
        UnauthenticatedError: the header is there but is not a bearer credential.
    """
    if headers is None:
        return None
    value = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not _TOKEN.fullmatch(token):
        raise UnauthenticatedError("the Authorization header must be 'Bearer <credential>'")
    return token


class ComputeMcp(MCPServer[Any]):
    """An MCP server whose tools are the methods of one control plane (see the module docstring).

    Args:
        plane: Where calls go.
        credential: The credential of every call that does not come with its own (stdio, in-process clients).
            Leave it out for a server behind HTTP, where each request brings its bearer token.
    """

    def __init__(self, plane: ControlPlane, *, credential: str | None = None) -> None:
        super().__init__(
            name="better-compute",
            version=__version__,
            instructions=(
                "Each tool is one method of the Better Compute control plane (GPU pools, nodes, reservations, IAM). "
                "A tool answers {'data': ...}, or an error {'error': {'code', 'message', ...}} whose code says what "
                "to do (INVALID_INPUT: fix the arguments; ACCESS_DENIED: the credential may not; NO_CAPACITY: "
                "try fewer GPUs or later). Give mutating tools an idempotency_key when you may retry."
            ),
        )
        self.plane = plane
        self._credential = credential
        self._tools: dict[str, ToolSpec] | None = None
        self._loading = anyio.Lock()

    async def tool_specs(self) -> dict[str, ToolSpec]:
        """The tools, by name, read from the plane's OpenAPI document once (the first caller waits for it).

        Raises:
            UnavailableError: the document cannot be had.
        """
        async with self._loading:
            if self._tools is None:
                status, body = await self.plane.exchange("GET", "/openapi.json", {"accept": "application/json"}, b"")
                try:
                    document = json.loads(body) if status == 200 else None
                except ValueError:
                    document = None
                if not isinstance(document, dict):
                    raise UnavailableError(f"the control plane gave no OpenAPI document (HTTP {status})")
                self._tools = tools_from_openapi(document)
            return self._tools

    async def list_tools(self) -> list[Tool]:
        """Every method as a tool."""
        try:
            specs = await self.tool_specs()
        except ComputeError as exc:
            raise MCPError(INTERNAL_ERROR, f"{exc.code}: {exc.message}") from None
        return [spec.tool for spec in specs.values()]

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        """Call the method behind ``name``; never raises (see the module docstring for the answers)."""
        try:
            return await self._call(name, arguments, self._caller(context))
        except ComputeError as exc:
            return _failure(exc)
        except Exception as exc:
            # The text may hold anything (a URL with a password, a header): the log gets the class only.
            log.error("internal error in MCP tool %r: %s", name[:128], type(exc).__name__)
            return _failure(InternalError("an internal error occurred"))

    def _caller(self, context: Context[Any, Any] | None) -> str | None:
        """The credential of this call: the HTTP request's bearer token when there is a request, else the one given
        at start."""
        headers: Mapping[str, str] | None = None
        if context is not None:
            try:
                headers = context.headers
            except ValueError:  # a context made outside a request has none
                headers = None
        token = _bearer(headers)
        return token if token is not None else self._credential

    async def _call(self, name: str, arguments: Mapping[str, Any], credential: str | None) -> CallToolResult:
        specs = await self.tool_specs()
        spec = specs.get(name)
        if spec is None:
            shown = name[:128]
            raise NotFoundError(f"no tool {shown!r}", details={"tool": shown})
        body = dict(arguments)
        headers = {"content-type": "application/json", "accept": "application/json"}
        if spec.key_argument and _KEY in body:
            key = body.pop(_KEY)
            if key is not None:
                if not isinstance(key, str) or not _KEY_PATTERN.fullmatch(key):
                    raise InvalidInputError(
                        "the idempotency key must be 1 to 255 printable ASCII characters without spaces",
                        details={"path": _KEY, "reason": "malformed idempotency key"},
                    )
                headers["idempotency-key"] = key
        if credential is not None:
            headers["authorization"] = f"Bearer {credential}"
        content = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        status, answer = await self.plane.exchange("POST", spec.path, headers, content)
        try:
            envelope = json.loads(answer)
        except (ValueError, UnicodeDecodeError):
            envelope = None
        if isinstance(envelope, dict) and status == 200 and "data" in envelope:
            return _answer({"data": envelope["data"]}, error=False)
        if isinstance(envelope, dict) and isinstance(envelope.get("error"), dict) and "code" in envelope["error"]:
            return _answer({"error": envelope["error"]}, error=True)
        raise UnavailableError(f"the control plane answered HTTP {status} without an envelope")


# --- transports ---------------------------------------------------------------------------------------------------


ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Any]


def _requires_bearer(app: Starlette) -> ASGIApp:
    """``app`` behind a check that every HTTP request carries ``Authorization: Bearer <credential>``: 401 with the
    ``UNAUTHENTICATED`` envelope otherwise. Whether the credential is good is the control plane's to say, per call."""

    async def guarded(
        scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            problem: UnauthenticatedError | None = None
            try:
                if _bearer(headers) is None:
                    problem = UnauthenticatedError("a credential is required (Authorization: Bearer <credential>)")
            except UnauthenticatedError as exc:
                problem = exc
            if problem is not None:
                body = json.dumps(problem.to_envelope(), separators=(",", ":")).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b'Bearer realm="better-compute"'),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


def streamable_http_app(plane: ControlPlane, *, path: str = "/mcp", host: str = "127.0.0.1") -> ASGIApp:
    """The MCP server over streamable HTTP at ``path``, as an ASGI app (its lifespan runs the MCP session manager);
    each request's bearer token is the credential of the calls it carries. Stateless: any process behind a load
    balancer can answer any request. ``host`` is where it listens (a loopback host turns on MCP's DNS-rebinding
    protection)."""
    server = ComputeMcp(plane)
    app = server.streamable_http_app(streamable_http_path=path, stateless_http=True, json_response=True, host=host)
    return _requires_bearer(app)


async def serve_stdio(plane: ControlPlane, credential: str) -> None:
    """Serve MCP on this process's stdin and stdout until the client closes them, every call with ``credential``."""
    await ComputeMcp(plane, credential=credential).run_stdio_async()


async def serve_http(plane: ControlPlane, *, host: str, port: int, path: str = "/mcp") -> None:
    """Serve MCP over streamable HTTP on ``host:port`` until cancelled (or SIGINT/SIGTERM)."""
    import uvicorn

    config = uvicorn.Config(
        streamable_http_app(plane, path=path, host=host), host=host, port=port, log_level="warning", lifespan="on"
    )
    with no_signal_reraise():  # SIGTERM stops it gracefully and the process exits 0, as serve does
        await uvicorn.Server(config).serve()
