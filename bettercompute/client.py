"""The typed HTTP client: ``AsyncClient`` and ``Client``, with the same typed access as ``compute.api``.

``await client.system.version()`` returns a ``VersionOutput``; an error envelope is raised as the class registered
for its code (``AccessDeniedError``, ...), exactly as the in-process ``api`` raises it. Transport failures (refused
connection, time-out) are ``UnavailableError``.

A call the server shed under load (503 ``UNAVAILABLE``, reason ``overloaded``, ``Retry-After``) did not run, so the
clients send it again, whatever the method, after the ``Retry-After`` seconds plus up to half as much again (so the
shed callers do not all come back at once): ``shed_retries`` times (2), and only when the server asks for at most
``_MAX_RETRY_AFTER`` seconds. Any other error, a 503 of another kind included, is raised at once.

The clients speak HTTP through httpx, so any httpx transport carries their calls (``transport=``), or a ready httpx
client with settings of its own (``http_client=``: limits, proxies, event hooks, headers)::

    # In the same process, without a socket (tests, a host application calling its own control plane):
    AsyncClient("http://compute", token, transport=httpx.ASGITransport(compute.asgi))
    # HTTP/2, negotiated over TLS (httpx needs the h2 package: pip install httpx[http2]):
    AsyncClient("https://compute.example.com", token, transport=httpx.AsyncHTTPTransport(http2=True))
    # A Unix socket (e.g. uvicorn --uds /run/bettercompute.sock); the URL's host is then only the Host header:
    AsyncClient("http://localhost", token, transport=httpx.AsyncHTTPTransport(uds="/run/bettercompute.sock"))
"""

from __future__ import annotations

import json
import random
import time
from types import TracebackType
from typing import Any, Self

import anyio
import httpx

from bettercompute._runtime import codec as _codec
from bettercompute._runtime.registry import (
    AsyncClientBinding,
    AsyncClientCall,
    ClientBinding,
    ClientCall,
    MethodDef,
)
from bettercompute._runtime.shedding import retry_delay
from bettercompute.errors import InternalError, InvalidInputError, UnavailableError, error_class_for_code
from bettercompute.modules.builtin import BuiltinGroups

__all__ = ["AsyncClient", "Client"]

_DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
_SHED_RETRIES = 2
_MAX_RETRY_AFTER = 30.0
"""A shed call is sent again only when the server asks to wait at most this many seconds; longer, it is raised."""


def _input_of(method: MethodDef[Any, Any], input: Any) -> Any:
    if input is None:
        try:
            return method.input()
        except TypeError:
            raise InvalidInputError(
                f"{method.group}.{method.name} needs a {method.input.__name__}", details={"path": ""}
            ) from None
    return input


def _result(method: MethodDef[Any, Any], response: httpx.Response) -> Any:
    try:
        payload = response.json()
    except (ValueError, UnicodeDecodeError):
        payload = None
    if isinstance(payload, dict) and response.status_code == 200 and "data" in payload:
        return _codec.decode(method.output, payload["data"])
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        error = payload["error"]
        cls = error_class_for_code(str(error.get("code", "")))
        details = error.get("details")
        raise cls(str(error.get("message", "")), details=details if isinstance(details, dict) else None)
    if response.status_code >= 500:
        raise UnavailableError(f"the server answered {response.status_code}", details={"status": response.status_code})
    raise InternalError(f"unexpected response {response.status_code}", details={"status": response.status_code})


def _shed_delay(response: httpx.Response) -> float | None:
    """The seconds to wait before sending a shed call again, jitter included; ``None`` when it must not be resent."""
    if response.status_code != 503:
        return None
    try:
        payload = response.json()
    except (ValueError, UnicodeDecodeError):
        return None
    delay = retry_delay(response.status_code, response.headers, payload)
    if delay is None or delay > _MAX_RETRY_AFTER:
        return None
    return delay * (1 + random.random() / 2)  # noqa: S311 - jitter, not a secret


def _body(method: MethodDef[Any, Any], input: Any) -> bytes:
    input = _input_of(method, input)
    if not isinstance(input, method.input):
        raise InvalidInputError(f"expected a {method.input.__name__}", details={"path": ""})
    return json.dumps(_codec.encode(input), separators=(",", ":")).encode()


def _headers(credential: str | None, idempotency_key: str | None) -> dict[str, str]:
    headers = {"content-type": "application/json", "accept": "application/json"}
    if credential:
        headers["authorization"] = f"Bearer {credential}"
    if idempotency_key is not None:
        headers["idempotency-key"] = idempotency_key
    return headers


class AsyncClient(BuiltinGroups[AsyncClientBinding]):
    """An async client of one control plane: the built-in groups are typed attributes (``client.pools.create``), a
    module's groups are reached through its group set (``IamGroups(client).tenants``).

    Args:
        base_url: Where it is served, e.g. ``http://127.0.0.1:3000`` (the endpoint path is added).
        credential: A Better IAM credential (``bcak_<id>.<secret>``).
        endpoint: The method path prefix, ``/api/compute`` unless the server mounts it elsewhere.
        timeout: Each call's time-out, for the httpx client made here (an ``http_client`` keeps its own).
        transport: The httpx transport the calls go through: ``httpx.ASGITransport(compute.asgi)`` in process,
            ``httpx.AsyncHTTPTransport(http2=True)`` for HTTP/2, ``httpx.AsyncHTTPTransport(uds=path)`` for a Unix
            socket (see the module's docstring). By default, httpx's own (HTTP/1.1 over TCP).
        http_client: A ready ``httpx.AsyncClient`` to send the calls with, instead of one made here (not with
            ``transport``). It is the caller's: ``aclose()`` leaves it open. Calls go to absolute URLs, so its own
            ``base_url`` is not used.
        shed_retries: How many times a call the server shed under load is sent again (after its ``Retry-After``);
            0 raises the ``UnavailableError`` at once.

    Raises:
        TypeError: both ``transport`` and ``http_client`` were given.
    """

    def __init__(
        self,
        base_url: str,
        credential: str | None = None,
        *,
        endpoint: str = "/api/compute",
        timeout: httpx.Timeout | float = _DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
        http_client: httpx.AsyncClient | None = None,
        shed_retries: int = _SHED_RETRIES,
    ) -> None:
        if http_client is not None and transport is not None:
            raise TypeError("give a transport or an http_client, not both (the client has its own transport)")
        self._owned = http_client is None
        self._http = http_client if http_client is not None else httpx.AsyncClient(timeout=timeout, transport=transport)
        self._url = base_url.rstrip("/") + endpoint
        self._credential = credential
        self._shed_retries = max(0, shed_retries)
        super().__init__(self)

    def binding(self) -> type[AsyncClientBinding]:
        """``AsyncClientBinding``: calls take an input."""
        return AsyncClientBinding

    def binder(self) -> tuple[Any, type[Any]]:
        """This client, and ``AsyncClientCall``."""
        return self, AsyncClientCall

    async def call(self, method: MethodDef[Any, Any], input: Any, *, idempotency_key: str | None = None) -> Any:
        """Call a method by its declaration (with an ``Idempotency-Key`` header when a key is given); a call the
        server shed is sent again (``shed_retries``)."""
        body = _body(method, input)
        headers = _headers(self._credential, idempotency_key)
        for attempt in range(self._shed_retries + 1):
            try:
                response = await self._http.post(self._url + method.path, content=body, headers=headers)
            except httpx.TransportError as exc:
                raise UnavailableError("the control plane cannot be reached", details={"method": method.path}) from exc
            delay = _shed_delay(response) if attempt < self._shed_retries else None
            if delay is None:
                break
            await anyio.sleep(delay)
        return _result(method, response)

    async def aclose(self) -> None:
        """Close the connections (those of an ``http_client`` given stay open: it is its owner's to close)."""
        if self._owned:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class Client(BuiltinGroups[ClientBinding]):
    """The blocking twin of ``AsyncClient``, for scripts: the same arguments, with ``httpx.BaseTransport`` (e.g.
    ``httpx.HTTPTransport(http2=True)`` or ``httpx.HTTPTransport(uds=path)``) and ``httpx.Client`` in place of their
    async kinds; ``close()`` leaves a given ``http_client`` open.

    Raises:
        TypeError: both ``transport`` and ``http_client`` were given.
    """

    def __init__(
        self,
        base_url: str,
        credential: str | None = None,
        *,
        endpoint: str = "/api/compute",
        timeout: httpx.Timeout | float = _DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        http_client: httpx.Client | None = None,
        shed_retries: int = _SHED_RETRIES,
    ) -> None:
        if http_client is not None and transport is not None:
            raise TypeError("give a transport or an http_client, not both (the client has its own transport)")
        self._owned = http_client is None
        self._http = http_client if http_client is not None else httpx.Client(timeout=timeout, transport=transport)
        self._url = base_url.rstrip("/") + endpoint
        self._credential = credential
        self._shed_retries = max(0, shed_retries)
        super().__init__(self)

    def binding(self) -> type[ClientBinding]:
        """``ClientBinding``: calls take an input."""
        return ClientBinding

    def binder(self) -> tuple[Any, type[Any]]:
        """This client, and ``ClientCall``."""
        return self, ClientCall

    def call(self, method: MethodDef[Any, Any], input: Any, *, idempotency_key: str | None = None) -> Any:
        """Call a method by its declaration (with an ``Idempotency-Key`` header when a key is given); a call the
        server shed is sent again (``shed_retries``)."""
        body = _body(method, input)
        headers = _headers(self._credential, idempotency_key)
        for attempt in range(self._shed_retries + 1):
            try:
                response = self._http.post(self._url + method.path, content=body, headers=headers)
            except httpx.TransportError as exc:
                raise UnavailableError("the control plane cannot be reached", details={"method": method.path}) from exc
            delay = _shed_delay(response) if attempt < self._shed_retries else None
            if delay is None:
                break
            time.sleep(delay)
        return _result(method, response)

    def close(self) -> None:
        """Close the connections (those of an ``http_client`` given stay open: it is its owner's to close)."""
        if self._owned:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
