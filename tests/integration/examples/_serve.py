"""An ASGI application served by uvicorn on loopback for the length of a block, lifespan and all."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio
import uvicorn

from tests._timing import deadline

from ..cli.conftest import free_port


@contextlib.asynccontextmanager
async def serving(
    app: Any, port: int | None = None, *, lifespan: Literal["auto", "on", "off"] = "auto"
) -> AsyncIterator[str]:
    """Serve ``app`` on ``127.0.0.1:port`` (a free one by default); yields its base URL. ``lifespan="off"`` for an
    app whose owner runs its start and stop."""
    port = port or free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan=lifespan)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        with anyio.fail_after(deadline(30)):
            while not server.started:  # uvicorn offers a flag, not an event
                if task.done():
                    task.result()  # it stopped before it started: say why
                await anyio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
