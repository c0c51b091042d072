"""Requests that could be read two ways are refused, through a real uvicorn server on loopback as well as ASGI.

A server hands the app the path percent-decoded (``path``) and as sent (``raw_path``): routing on the decoded path
would let ``system%2Fversion`` reach ``system/version``, which a proxy in front may have judged as one segment. A
header given twice may be read as the first value by a proxy and the last by the app.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
import uvicorn

from ..conftest import Plane

pytestmark = [pytest.mark.pg, pytest.mark.anyio]

ESCAPED = [
    "/system%2Fversion",
    "/system%2fversion",
    "/system%252Fversion",
    "/system%25252Fversion",
    "%2Fsystem%2Fversion",
    "/system/%76ersion",
]


@pytest.fixture(params=["asgi", "uvicorn"])
async def client(request: pytest.FixtureRequest, plane: Plane) -> AsyncIterator[httpx.AsyncClient]:
    if request.param == "asgi":
        yield plane.http
        return
    # TCP named, so that asyncio turns Nagle off on its connections (else ~40 ms a keep-alive request).
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.bind(("127.0.0.1", 0))
    # Listening before uvicorn starts: connections wait in the backlog, so there is no start-up to wait for.
    listener.listen()
    port = listener.getsockname()[1]
    config = uvicorn.Config(plane.compute.asgi, lifespan="off", log_level="warning", http="h11", ws="none")
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [listener])
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                yield http
        finally:
            server.should_exit = True


@pytest.mark.parametrize("path", ESCAPED)
async def test_an_escaped_slash_in_the_method_path_is_404(client: httpx.AsyncClient, plane: Plane, path: str) -> None:
    headers = {"authorization": f"Bearer {plane.root}"}
    response = await client.post(f"{plane.compute.endpoint}{path}", headers=headers, json={})
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "NOT_FOUND"
    # The control: spelled plainly, over the same connection, the method answers.
    plain = await client.post(f"{plane.compute.endpoint}/system/version", headers=headers, json={})
    assert plain.status_code == 200, plain.text


async def test_two_authorization_headers_are_400(client: httpx.AsyncClient, plane: Plane) -> None:
    url = f"{plane.compute.endpoint}/system/whoami"
    twice = [("authorization", f"Bearer {plane.root}"), ("authorization", "Bearer bcak_someone.else")]
    for headers in (twice, list(reversed(twice)), [twice[0], twice[0]]):
        response = await client.post(url, headers=headers, json={})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "INVALID_INPUT" and error["details"] == {"header": "authorization"}
    once = await client.post(url, headers=[twice[0]], json={})
    assert once.status_code == 200 and once.json()["data"]["is_root"] is True
