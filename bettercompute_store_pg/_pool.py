"""The store's connection pool: psycopg connections made in the caller's task, at most ``size`` at once.

Neither of the two ready-made pools fitted, both measured (``bench/joins.py``):

- SQLAlchemy's async pool reaches its synchronous queue through a greenlet hop on every checkout and return: about
  0.3-0.8 ms of CPU per join (7 checkouts), an eighth of all the CPU a join costs.
- ``psycopg_pool`` connects in background workers that retry: a caller facing an unreachable server waits out the
  whole checkout timeout (10 s) instead of failing at once, and every failed attempt is logged with the server's
  address.

So this one is small and does only what the store needs. A connection is made by the caller that needs it (an
unreachable server fails that call at once); an idle connection is handed out newest first, after a check that
costs no round trip (a live idle connection has nothing to read: the server speaks only when asked); a connection
that the server closed (a restart while the pool sat idle) is found by that check, and then every idle one is
dropped, since a restart killed them all, before any statement was sent on them. Waiters are served in arrival
order; one that gives up (timeout, cancellation) hands a slot it was just given on to the next.

Nothing here is bound to an event loop: a waiter's future belongs to the loop that waits.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import select
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import anyio
import psycopg
from psycopg.abc import PQGen
from psycopg.pq import TransactionStatus

from bettercompute.errors import InternalError, UnavailableError

from ._errors import UNREACHABLE, translated

__all__ = ["PIPELINE_SHIELD_SECONDS", "ConnectionPool", "PgConnection", "pipelined"]

PIPELINE_SHIELD_SECONDS = 60
"""How long a pipeline round trip is finished after its task was cancelled (see ``pipelined``)."""

RV = TypeVar("RV")


class PgConnection(psycopg.AsyncConnection[Any]):
    """A pooled psycopg connection (autocommit), with the statements its open transaction has not sent yet.

    ``pending`` holds statements that need no answer (BEGIN, and writes whose rows no one reads): they are sent
    with the transaction's next statement, in one pipeline, or with its COMMIT (``_db.fetch_in``, ``defer_in``).
    """

    pending: list[tuple[str, Any]]
    round_trips: int
    """Round trips this connection made through the store's paths since it was last checked out."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pending = []
        self.round_trips = 0

    async def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool = False
    ) -> psycopg.AsyncCursor[Any]:
        """psycopg's ``execute``, after sending what the transaction holds back (so a statement run this way by an
        adapter of another package is inside the transaction, after the writes before it)."""
        if self.pending:
            await self.flush()
        self.round_trips += 1
        return await super().execute(query, params, prepare=prepare, binary=binary)

    async def wait(self, gen: PQGen[RV], *args: Any, **kwargs: Any) -> RV:
        """psycopg's ``wait`` (every round trip goes through it), and a round trip it gives up on is ended at once.

        Interrupted (its task cancelled by asyncio itself, which no anyio shield holds back, as a gateway closing
        does) with nothing of the transaction in flight, or a second time while it cancels the query, psycopg
        gives up a round trip as a suspended generator. Left to the garbage collector, a pipeline's one ran later,
        often after the pool had closed the connection, and failed there: an unraisable exception.
        """
        try:
            return await super().wait(gen, *args, **kwargs)
        except BaseException:
            with contextlib.suppress(Exception):  # it finds the connection closed, or wants to wait for the server
                gen.close()
            raise

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        """psycopg's ``cursor``; refused while the transaction holds statements back, as a statement run on it
        would otherwise run before BEGIN, outside the transaction (send them first: ``execute``, ``fetch_in``).

        Raises:
            InternalError: statements are held back (a programming error).
        """
        if self.pending:
            raise InternalError("statements of this transaction are not sent yet: run a statement with execute first")
        return super().cursor(*args, **kwargs)

    async def flush(self) -> None:
        """Send the statements held back, in one round trip (a pipeline)."""
        pending, self.pending = self.pending, []
        self.round_trips += 1
        with translated():
            async with pipelined(self):
                for query, params in pending:
                    await super().execute(query, params, prepare=False if params is None else None)


@contextlib.asynccontextmanager
async def pipelined(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[None]:
    """A psycopg pipeline that is finished even when its task is cancelled meanwhile by anyio (a worker stopping).
    Bounded by ``PIPELINE_SHIELD_SECONDS``, so a server that no longer answers cannot hold a stopping task for long;
    the cancellation takes effect right after. asyncio's own cancellation is not held back: a round trip psycopg
    gives up then is ended by ``PgConnection.wait``.

    Raises:
        UnavailableError: the round trip did not end within that bound.
    """
    with anyio.move_on_after(PIPELINE_SHIELD_SECONDS, shield=True) as scope:
        async with conn.pipeline():
            yield
    if scope.cancelled_caught:
        raise UnavailableError("the database did not answer in time")


def _alive(conn: PgConnection) -> bool:
    """Whether an idle pooled connection may be handed out, without a round trip in the usual case."""
    if conn.closed or conn.broken:
        return False
    poller = select.poll()
    poller.register(conn.pgconn.socket, select.POLLIN)
    # Readable: the server said goodbye (a FATAL message, then EOF) or sent something unasked.
    return not poller.poll(0)


def reusable(conn: PgConnection) -> bool:
    """Whether a returned connection can go back as it is: open, in autocommit, no transaction, nothing unsent."""
    return (
        not conn.broken
        and not conn.closed
        and conn.autocommit
        and conn.info.transaction_status == TransactionStatus.IDLE
        and not conn.pending
    )


class ConnectionPool:
    """At most ``size`` connections to ``conninfo``, made on first use (see the module docstring).

    Args:
        conninfo: A libpq connection string or URI.
        size: The most connections open at once, idle or in use.
        checkout_timeout: How long ``get`` waits for a free slot before ``UnavailableError``.
        connect_kwargs: Passed to ``psycopg.AsyncConnection.connect`` (``autocommit`` is always on).
    """

    def __init__(self, conninfo: str, *, size: int, checkout_timeout: float, **connect_kwargs: Any) -> None:
        self._conninfo = conninfo
        self._kwargs = {**connect_kwargs, "autocommit": True}
        self.size = size
        self.checkout_timeout = checkout_timeout
        self._free = size  # slots: connections that may still be made or handed out
        self._idle: collections.deque[PgConnection] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.closed = False

    @property
    def idle(self) -> int:
        """Connections open and free now."""
        return len(self._idle)

    async def get(self) -> PgConnection:
        """A connection of the pool, for the caller alone until ``put`` (or ``drop``).

        Raises:
            UnavailableError: The database cannot be reached, or no slot was free within ``checkout_timeout``.
        """
        if self.closed:
            raise UnavailableError(UNREACHABLE)
        await self._slot()
        try:
            while self._idle:
                conn = self._idle.pop()
                if _alive(conn) or await _answers(conn):
                    return conn
                # The server closed it: after a restart every connection made before is dead; drop them all.
                await _close(conn)
                while self._idle:
                    await _close(self._idle.pop())
            with translated():
                return await PgConnection.connect(self._conninfo, **self._kwargs)
        except BaseException:
            self._release_slot()
            raise

    def put(self, conn: PgConnection) -> bool:
        """Give ``conn`` back; ``False`` if it is not reusable as it is (then ``drop`` it instead)."""
        if self.closed or not reusable(conn):
            return False
        self._idle.append(conn)
        self._release_slot()
        return True

    async def drop(self, conn: PgConnection) -> None:
        """Close a connection that was handed out and free its slot; shielded, so that its slot is never lost."""
        with anyio.CancelScope(shield=True):
            try:
                await _close(conn)
            finally:
                self._release_slot()

    async def close(self) -> None:
        """Close every idle connection; those handed out are closed when they come back. Idempotent."""
        self.closed = True
        while self._idle:
            await _close(self._idle.pop())

    async def _slot(self) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            with anyio.fail_after(self.checkout_timeout):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._release_slot()  # given a slot just as it gave up: pass it on
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                # No slot in time: for this process the database is out of reach now.
                raise UnavailableError(UNREACHABLE) from None
            raise

    def _release_slot(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


async def _answers(conn: PgConnection) -> bool:
    """Whether a connection with something unasked to read still answers a ``SELECT 1``."""
    try:
        await conn.execute("SELECT 1", prepare=False)
    except psycopg.Error:
        return False
    return True


async def _close(conn: PgConnection) -> None:
    with contextlib.suppress(psycopg.Error, OSError):
        await conn.close()
