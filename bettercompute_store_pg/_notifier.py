"""``PgNotifier``: pokes over LISTEN/NOTIFY, on dedicated connections that never go through a pool."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator

import anyio
import psycopg
from psycopg import sql

from bettercompute.errors import InvalidInputError

from ._db import driver_url
from ._errors import translated
from ._schema import validate_schema

__all__ = ["PgNotifier", "channel_name"]

_MAX_CHANNEL_BYTES = 63  # PostgreSQL truncates longer identifiers, which would merge distinct channels.


def channel_name(schema: str, channel: str) -> str:
    """The PostgreSQL channel of ``channel`` for the store in ``schema``: ``<schema>.<channel>``, hashed when too
    long to stay distinct (so a statement can poke the listeners ``PgNotifier`` serves).

    Raises:
        InvalidInputError: ``channel`` is empty.
    """
    if not channel:
        raise InvalidInputError("a channel name must not be empty")
    name = f"{schema}.{channel}"
    if len(name.encode()) > _MAX_CHANNEL_BYTES:
        name = f"{schema}.{hashlib.sha256(channel.encode()).hexdigest()[:16]}"
    return name


class PgNotifier:
    """``bettercompute.ports.Notifier`` on PostgreSQL LISTEN/NOTIFY.

    Each ``listen`` opens its own autocommit connection straight to the server (LISTEN is session state, so it must
    not go through PgBouncer in transaction mode); ``notify`` uses one shared autocommit connection, opened on first
    use, so pokes are sent one at a time. A poke is a wake-up, and two identical ones wake the same listeners: a
    ``notify`` that finds the same poke (channel and payload) still waiting its turn returns at once, since that
    one is sent after it was called (a busy gateway commits hundreds of transactions a second, each poking; sent one
    by one they queued for seconds and made every commit wait). Channels are prefixed with the schema name, so
    stores in different schemas never hear each other.

    Args:
        url: ``postgresql://`` URL of the server itself (not of a transaction-mode pooler).
        schema: The store's schema; the channel prefix.
    """

    def __init__(self, url: str, *, schema: str = "bettercompute") -> None:
        self._conninfo = driver_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self.schema = validate_schema(schema)
        self._sender: psycopg.AsyncConnection[tuple[object, ...]] | None = None
        self._lock = anyio.Lock()
        self._waiting: set[tuple[str, str]] = set()
        """Pokes waiting for the sending connection, not sent yet."""

    def channel_name(self, channel: str) -> str:
        """The PostgreSQL channel for ``channel``: ``<schema>.<channel>``, hashed when too long to stay distinct.

        Raises:
            InvalidInputError: ``channel`` is empty.
        """
        return channel_name(self.schema, channel)

    async def _connect(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        return await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True, connect_timeout=5)

    async def notify(self, channel: str, payload: str = "") -> None:
        """Send a poke; nobody listening is not an error.

        Raises:
            UnavailableError: The database cannot be reached.
        """
        name = self.channel_name(channel)
        poke = (name, payload)
        if poke in self._waiting:  # the same poke, still to be sent, wakes the same listeners after this call
            return
        self._waiting.add(poke)
        try:
            await self._lock.acquire()
        finally:
            # From here on a new call sends again: this send may have begun before that caller's commit.
            self._waiting.discard(poke)
        try:
            with translated():
                if self._sender is None or self._sender.closed:
                    self._sender = await self._connect()
                try:
                    await self._sender.execute("SELECT pg_notify(%s, %s)", (name, payload))
                except psycopg.OperationalError:
                    # A broken connection is dropped so the next poke reconnects.
                    await self._sender.close()
                    self._sender = None
                    raise
        finally:
            self._lock.release()

    @contextlib.asynccontextmanager
    async def listen(self, channel: str) -> AsyncIterator[AsyncIterator[str]]:
        """Receive the payloads of pokes sent on ``channel`` while the context is open.

        Raises:
            UnavailableError: The database cannot be reached.
        """
        name = self.channel_name(channel)
        with translated():
            conn = await self._connect()
        try:
            with translated():
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(name)))
            yield _payloads(conn)
        finally:
            with anyio.CancelScope(shield=True):
                await conn.close()

    async def close(self) -> None:
        """Close the sending connection. Idempotent."""
        async with self._lock:
            if self._sender is not None:
                await self._sender.close()
                self._sender = None

    async def __aenter__(self) -> PgNotifier:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def _payloads(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> AsyncIterator[str]:
    with translated():
        async for notification in conn.notifies():
            yield notification.payload
