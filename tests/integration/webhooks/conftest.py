"""A control plane with a KMS (so the ``webhooks`` group is registered), and a real HTTP receiver on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import httpx
import pytest

from bettercompute import BetterCompute, Events, LocalKeyKms, Options, better_compute
from bettercompute.modules.webhooks import CreateWebhookInput, WebhookSettings, WebhooksGroup
from bettercompute.testing import GuardedKms
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore
from tests._timing import deadline

from ..iam.conftest import two_tenants

FAST = WebhookSettings(
    max_attempts=4,
    backoff=dt.timedelta(milliseconds=100),
    max_backoff=dt.timedelta(milliseconds=300),
    timeout=dt.timedelta(seconds=2),
    allow_private_destinations=True,  # the receiver listens on loopback
)
GUARDED = attrs.evolve(FAST, allow_private_destinations=False)


@attrs.frozen
class Received:
    headers: dict[str, str]
    body: bytes


class Receiver:
    """A minimal HTTP/1.1 server on a real loopback socket: records every POST, answers ``status``."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.connections = 0
        self.status = 200
        self.port = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if self.status < 300:
                self.received.append(Received(headers=headers, body=body))
            writer.write(f"HTTP/1.1 {self.status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode())
            await writer.drain()
        finally:
            writer.close()


@attrs.frozen(kw_only=True)
class Hooks:
    compute: BetterCompute
    store: PgStore
    key_file: Path
    root: str
    acme: str
    alice: str
    globex: str
    mallory: str
    http: httpx.AsyncClient

    @property
    def api(self) -> WebhooksGroup[Any]:
        group: WebhooksGroup[Any] = self.compute.api.group(WebhooksGroup)
        return group

    async def subscribe(self, url: str, *types: str) -> tuple[str, str]:
        created = await self.api.create(self.alice, CreateWebhookInput(tenant=self.acme, url=url, event_types=types))
        return created.webhook.id, created.secret

    async def publish(self, type: str, key: str, tenant: str | None = None, **payload: Any) -> None:
        async with self.store.transaction() as tx:
            await tx.publish([Events.event(type, key, tenant=tenant or self.acme, **payload)])

    async def pump(self, done: Callable[[], bool], *, within: float = 20) -> None:
        """Run the ``sinks`` role's jobs, pass after pass, until ``done()``."""
        with anyio.fail_after(deadline(within)):
            while not done():
                await self.compute.jobs.tick({"sinks"})
                await anyio.sleep(0.02)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    server = Receiver()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def open_hooks(database_url: str, schema: str, key_file: Path, **options: Any) -> AsyncIterator[Hooks]:
    """A control plane with a KMS on ``key_file`` and the ``FAST`` settings (and ``options``), with two tenants."""
    # The KMS double fails a call made inside a transaction (sealing on create, opening before a send).
    kms = GuardedKms(LocalKeyKms(key_file))
    async with two_tenants(database_url, schema, kms=kms, webhooks=FAST, **options) as t:
        yield Hooks(
            compute=t.compute,
            store=t.store,
            key_file=key_file,
            root=t.root,
            acme=t.acme,
            alice=t.alice,
            globex=t.globex,
            mallory=t.mallory,
            http=t.http,
        )


@pytest.fixture
async def hooks(database_url: str, fresh_schema: str, tmp_path: Path) -> AsyncIterator[Hooks]:
    async with open_hooks(database_url, fresh_schema, tmp_path / "kms.key") as opened:
        yield opened


@pytest.fixture
async def guarded(hooks: Hooks, database_url: str) -> AsyncIterator[BetterCompute]:
    """A second control plane on the same schema and key, with the SSRF guard on (the default settings)."""
    async with second_plane(hooks, database_url, GUARDED, instance="test-2") as compute:
        yield compute


@contextlib.asynccontextmanager
async def second_plane(
    hooks: Hooks, database_url: str, settings: WebhookSettings, *, instance: str
) -> AsyncIterator[BetterCompute]:
    """A second control plane on the same schema and key, sending with ``settings``."""
    store = PgStore(database_url, schema=hooks.store.schema, pool_size=2)
    options = Options(
        store=store, iam=EmbeddedIam(), instance=instance, kms=LocalKeyKms(hooks.key_file), webhooks=settings
    )
    compute = better_compute(options)
    await compute.initialize()
    try:
        yield compute
    finally:
        await compute.close()


@pytest.fixture
async def keyless(hooks: Hooks, database_url: str, tmp_path: Path) -> AsyncIterator[BetterCompute]:
    """A second control plane on the same schema whose KMS has another key file: it cannot open any secret."""
    store = PgStore(database_url, schema=hooks.store.schema, pool_size=2)
    other_key = tmp_path / "other" / "kms.key"
    options = Options(store=store, iam=EmbeddedIam(), instance="keyless", kms=LocalKeyKms(other_key), webhooks=FAST)
    compute = better_compute(options)
    await compute.initialize()
    try:
        yield compute
    finally:
        await compute.close()
