"""The ASGI lifespan: a module whose start() fails makes startup fail, instead of serving uninitialized."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from bettercompute import ModuleContext, Options, better_compute
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@attrs.frozen(kw_only=True)
class BrokenModule:
    name: str = "broken"
    version: str = "1.0.0"
    core_range: str = ">=0.1"
    groups: tuple[Any, ...] = ()
    actions: tuple[str, ...] = ()
    migrations: dict[str, Any] = attrs.field(factory=dict)
    jobs: tuple[Any, ...] = ()

    async def start(self, context: ModuleContext) -> None:
        raise RuntimeError("a bug in a module")

    async def stop(self) -> None:
        return None


async def test_a_failing_module_start_fails_the_lifespan(database_url: str, fresh_schema: str) -> None:
    store = PgStore(database_url, schema=fresh_schema, pool_size=2)
    compute = better_compute(Options(store=store, iam=EmbeddedIam(), modules=[BrokenModule()]))
    sent: list[Any] = []
    messages = iter([{"type": "lifespan.startup"}])

    async def receive() -> Any:
        return next(messages)

    async def send(message: Any) -> None:
        sent.append(message)

    try:
        await compute.asgi({"type": "lifespan"}, receive, send)
    finally:
        await compute.close()
    assert sent == [{"type": "lifespan.startup.failed", "message": "INTERNAL: initialize() failed"}]
    assert not compute.initialized
