"""The socket ``serve`` listens on: its connections send each write at once (no Nagle delay behind a delayed ACK)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from bettercompute_cli._runtime import _listen

pytestmark = pytest.mark.anyio


async def test_an_accepted_connection_has_nagle_off() -> None:
    listener = _listen("127.0.0.1", 0)
    listener.listen()
    nodelay: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = writer.get_extra_info("socket")
        nodelay.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(accepted, sock=listener)
    try:
        _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        try:
            assert await asyncio.wait_for(nodelay, 10) != 0
        finally:
            writer.close()
            await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()
