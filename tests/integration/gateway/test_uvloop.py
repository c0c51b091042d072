"""The gateway on uvloop, the event loop it is meant to run on (DESIGN §11): it says which port it bound when asked
for any free one, and holds a session over mutual TLS as on the standard library's loop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvloop

from .conftest import Wire, hello, session_request

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "asyncio", {"use_uvloop": True}


async def test_on_uvloop_the_gateway_reports_its_port_and_holds_a_session(gw: Wire) -> None:
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
    assert gw.port != 0 and gw.gateway.port == gw.port
    joined = await gw.join()
    channel = gw.channel(joined)
    try:
        async with session_request(channel) as stream:
            await stream.send_request()
            await stream.send_message(hello(joined.node_id))
            welcome = await stream.recv_message()
            assert welcome is not None and welcome.welcome is not None and welcome.welcome.epoch == 1
            assert gw.gateway.sessions == {joined.node_id: 1}
            await stream.end()
    finally:
        channel.close()
