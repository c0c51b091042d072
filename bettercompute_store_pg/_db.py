"""The store's one way to the database: a pool of psycopg 3 connections, and statements run on them directly.

Every statement, in a transaction or on its own, is sent by psycopg's ``AsyncConnection``; no SQLAlchemy
``Connection``, compilation or ``Result`` sits on any statement's path. Pooled connections stay in autocommit: a
statement on its own is one round trip (no BEGIN, no COMMIT), and a transaction is an explicit ``BEGIN`` ...
``COMMIT`` on one checked-out connection (``Database.transaction``).

The pool is SQLAlchemy's (``QueuePool`` through ``create_async_engine``, used for nothing but the URL and
``raw_connection()``), not ``psycopg_pool``. That costs CPU: on the 2-core development machine a checkout and
return takes about 45-90 µs here against about 13-30 µs with psycopg_pool (the greenlet hop of SQLAlchemy's
async pool), and a join (``bench/joins.py``, 7 checkouts) about 0.3-0.8 ms more of its roughly 7 ms. What decided
it is behaviour: SQLAlchemy's pool connects in the caller's task, so an unreachable server fails the call at once
with ``UnavailableError``, where psycopg_pool connects in background workers that retry while the caller waits out
the whole checkout timeout (10 s), and logs every failed attempt with the server's address. Its checkout event
also runs the dead-connection check below, which discards every connection of the pool at once after a server
restart, before any statement is sent.

Statement text is fixed per ``Statement``, so psycopg's automatic prepare (off with ``prepared_statements=False``,
for PgBouncer in transaction mode) sees the same query every time. BEGIN, COMMIT and ROLLBACK are never prepared.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import functools
import json
import re
import select
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import anyio
import attrs
import psycopg
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.rows import RowMaker
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, InvalidatePoolError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection
from sqlalchemy.util import greenlet_spawn

from bettercompute.errors import InternalError, InvalidConfigError, InvalidInputError

from ._errors import translated
from ._schema import quote_schema

__all__ = [
    "CHECKOUT_TIMEOUT_SECONDS",
    "CONNECT_TIMEOUT_SECONDS",
    "Connection",
    "Database",
    "PoolUsage",
    "Statement",
    "driver_url",
    "dumps",
    "fetch_in",
    "named_row",
    "rowcount_in",
    "utc",
    "when",
]

Connection = psycopg.AsyncConnection[Any]
"""A pooled connection, as psycopg gives it (in autocommit; its rows are tuples unless a cursor says otherwise)."""

CONNECT_TIMEOUT_SECONDS = 5
"""libpq's connect timeout: an unreachable server fails fast instead of hanging a request."""

CHECKOUT_TIMEOUT_SECONDS = 10
"""How long a call waits for a free pooled connection before it fails with ``UnavailableError``."""

ROLLBACK_TIMEOUT_SECONDS = 5
"""How long a failed or cancelled transaction's ROLLBACK may take before its connection is dropped instead."""

# ``:name`` (not ``::type``) becomes psycopg's ``%(name)s``; a literal ``%`` is doubled.
_BIND = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")


def named_row(cursor: psycopg.AsyncCursor[Any]) -> RowMaker[Any]:
    """psycopg row factory: rows as named tuples, the columns as attributes.

    Unlike psycopg's ``namedtuple_row``, a column whose name is repeated (``SELECT count(*), count(*) FILTER ...``)
    or is no identifier (``?column?``) is renamed to its position (``_1``) instead of failing the statement.
    """
    result = cursor.pgresult
    if result is None or result.nfields == 0:
        return tuple
    encoding = cursor.connection.info.encoding
    return _row_type(encoding, tuple(result.fname(i) or b"" for i in range(result.nfields)))


@functools.lru_cache(512)
def _row_type(encoding: str, names: tuple[bytes, ...]) -> Callable[[Sequence[Any]], Any]:
    # The columns are known only at run time, so mypy cannot type the class (hence Any).
    factory: Any = collections.namedtuple
    make: Callable[[Sequence[Any]], Any] = factory("Row", [name.decode(encoding) for name in names], rename=True)._make
    return make


@attrs.frozen(eq=False)
class Statement:
    """One SQL statement as psycopg query text: written with ``:name`` parameters, converted once when built."""

    query: str

    @classmethod
    def of(cls, sql: str) -> Statement:
        """``sql`` with ``:name`` parameters."""
        return cls(_BIND.sub(r"%(\1)s", sql.replace("%", "%%")))


@attrs.define
class PoolUsage:
    """How the pool is used: checkouts so far, connections held now, and the most held at once since
    ``reset_peak()``. Every database access of the store, by any path, is one checkout."""

    checkouts: int = 0
    in_use: int = 0
    peak: int = 0

    def reset_peak(self) -> None:
        """Start measuring the peak again from the connections held now."""
        self.peak = self.in_use


def driver_url(url: str) -> URL:
    """``url`` with the psycopg 3 driver (``postgresql://`` and ``postgres://`` are accepted too).

    Raises:
        InvalidConfigError: The URL cannot be parsed or names another database or driver.
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        # The URL may hold a password: neither it nor the parser's text goes into the message.
        raise InvalidConfigError("the database URL cannot be parsed") from exc
    if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg"):
        return parsed.set(drivername="postgresql+psycopg")
    raise InvalidConfigError(
        "the database URL must start with postgresql:// or postgresql+psycopg://",
        details={"problems": [{"path": "url", "scheme": parsed.drivername}]},
    )


def _refuse_dead_connection(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: PoolProxiedConnection) -> None:
    """Hand out no pooled connection the server has already closed (a restart while the pool sat idle).

    A live idle connection has nothing to read: the server speaks only when asked. A readable socket means the
    server said goodbye (a FATAL message, then EOF) or sent something unasked; only then is the connection asked
    a ``SELECT 1``, so the usual checkout costs one ``poll`` and no round trip. A dead one invalidates the whole
    pool: after a restart every connection made before it is dead too, and the pool replaces them (it reconnects
    on the spot) before any statement was sent, so none can have run twice.
    """
    conn = record.driver_connection
    if not isinstance(conn, psycopg.AsyncConnection):
        return
    try:
        if conn.closed or conn.broken:
            raise InvalidatePoolError("the pooled connection is closed")
        poller = select.poll()
        poller.register(conn.pgconn.socket, select.POLLIN)
        if not poller.poll(0):
            return
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT 1")
        finally:
            cursor.close()
    except InvalidatePoolError:
        raise
    except Exception as exc:
        raise InvalidatePoolError("the pooled connection was closed by the server") from exc


@attrs.define
class Database:
    """The store's pool (``None`` until ``open``), its schema, and the ways to run statements on it."""

    schema: str
    engine: AsyncEngine | None = None
    usage: PoolUsage = attrs.field(factory=PoolUsage)

    def sql(self, template: str) -> Statement:
        """A statement with ``{s}`` replaced by the quoted schema; build it once and reuse it."""
        return Statement.of(template.replace("{s}", quote_schema(self.schema)))

    def open(self, url: URL, *, pool_size: int, prepared_statements: bool) -> None:
        """Create the pool (no connection yet: each is made by the first call that needs it). Idempotent."""
        if self.engine is not None:
            return
        connect_args: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_SECONDS, "autocommit": True}
        if not prepared_statements:
            connect_args["prepare_threshold"] = None
        engine = create_async_engine(
            url,
            pool_size=pool_size,
            max_overflow=0,
            pool_timeout=CHECKOUT_TIMEOUT_SECONDS,
            # A connection goes back only idle (``_release``), so the pool has nothing to roll back.
            pool_reset_on_return=None,
            connect_args=connect_args,
        )
        event.listen(engine.sync_engine.pool, "checkout", _refuse_dead_connection)
        self.engine = engine

    async def close(self) -> None:
        """Close every pooled connection. Idempotent."""
        engine, self.engine = self.engine, None
        if engine is not None:
            with translated():
                await engine.dispose()

    def require(self) -> AsyncEngine:
        """The pool's engine.

        Raises:
            InternalError: ``open()`` was not called (a programming error).
        """
        if self.engine is None:
            raise InternalError("the store is not open")
        return self.engine

    async def _checkout(self) -> PoolProxiedConnection:
        """A pooled connection, counted in ``usage``; give it back with ``_checkin``."""
        engine = self.require()
        with translated():
            fairy = await engine.raw_connection()
        usage = self.usage
        usage.checkouts += 1
        usage.in_use += 1
        usage.peak = max(usage.peak, usage.in_use)
        return fairy

    async def _checkin(self, fairy: PoolProxiedConnection) -> None:
        self.usage.in_use -= 1
        await _release(fairy)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """A pooled connection, in autocommit, for the block; it goes back to the pool only when idle.

        A connection left in a transaction or mid-statement (the block was cancelled, or the server went away) is
        dropped instead, so the pool never hands out a dirty one.
        """
        fairy = await self._checkout()
        try:
            yield _driver(fairy)
        finally:
            await self._checkin(fairy)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """``BEGIN`` on a pooled connection; ``COMMIT`` when the block ends, ``ROLLBACK`` if it raises.

        Raises:
            UnavailableError: The database cannot be reached, or asked for the transaction to be retried.
            ConflictError, InternalError: As ``translated`` maps the driver's errors.
        """
        async with self.connection() as conn:
            with translated():
                await conn.execute("BEGIN", prepare=False)
            try:
                yield conn
            except BaseException:
                await _rollback(conn)
                raise
            with translated():
                await conn.execute("COMMIT", prepare=False)

    async def fetch(self, statement: Statement, params: Mapping[str, Any]) -> list[Any]:
        """Run one statement in its own (autocommit) transaction; its rows, with the columns as attributes."""
        rows, _ = await self._run(statement, params)
        return rows

    async def rowcount(self, statement: Statement, params: Mapping[str, Any]) -> int:
        """Run one statement in its own (autocommit) transaction and return how many rows it changed."""
        _, count = await self._run(statement, params)
        return count

    async def _run(self, statement: Statement, params: Mapping[str, Any]) -> tuple[list[Any], int]:
        """One round trip on a pooled connection, in autocommit (no BEGIN, no COMMIT).

        The checkout is written out rather than taken from ``connection()``: this is the store's hottest path.
        """
        fairy = await self._checkout()
        try:
            with translated():
                cur = _driver(fairy).cursor(row_factory=named_row)
                await cur.execute(statement.query, params)
                return await _rows(cur), cur.rowcount
        finally:
            await self._checkin(fairy)


def _driver(fairy: PoolProxiedConnection) -> Connection:
    conn = fairy.driver_connection
    assert isinstance(conn, psycopg.AsyncConnection)  # the pool holds psycopg connections only
    return conn


async def _rows(cur: psycopg.AsyncCursor[Any]) -> list[Any]:
    """The rows of the statement ``cur`` ran, or none if it returns none (an UPDATE without RETURNING).

    Asks the result's status, not ``cur.description``, which would build a column object per column each time.
    """
    result = cur.pgresult
    if result is None or result.status != ExecStatus.TUPLES_OK:
        return []
    return await cur.fetchall()


async def _rollback(conn: Connection) -> None:
    """End a failed or cancelled block's transaction, shielded from the cancellation and bounded in time.

    A connection mid-statement (cancelled while waiting for its result) is left as it is: ``_release`` drops it,
    and the server rolls back when the connection closes.
    """
    if conn.broken or conn.info.transaction_status not in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        return
    with anyio.move_on_after(ROLLBACK_TIMEOUT_SECONDS, shield=True), contextlib.suppress(psycopg.Error):
        await conn.execute("ROLLBACK", prepare=False)


async def _release(fairy: PoolProxiedConnection) -> None:
    """Return ``fairy`` to the pool, or drop it if its connection is not reusable as is.

    Returning an idle connection does no I/O (the pool resets nothing on return), so it is a plain call: nothing
    can cancel it midway. Dropping one closes its connection, which the pool does through its greenlet bridge;
    that is shielded from cancellation, as an interrupted drop would lose the pool's slot.
    """
    conn = fairy.driver_connection
    usable = (
        isinstance(conn, psycopg.AsyncConnection)
        and not conn.broken
        and conn.autocommit
        and conn.info.transaction_status == TransactionStatus.IDLE
    )
    if usable:
        fairy.close()
        return
    with anyio.CancelScope(shield=True):
        await greenlet_spawn(fairy.invalidate)
        await greenlet_spawn(fairy.close)


async def fetch_in(conn: Connection, statement: Statement, params: Mapping[str, Any]) -> list[Any]:
    """Run one statement on a connection whose transaction the caller owns; its rows, columns as attributes."""
    with translated():
        cur = conn.cursor(row_factory=named_row)
        await cur.execute(statement.query, params)
        return await _rows(cur)


async def rowcount_in(conn: Connection, statement: Statement, params: Mapping[str, Any]) -> int:
    """Run one statement on a connection whose transaction the caller owns; how many rows it changed."""
    with translated():
        cur = conn.cursor()
        await cur.execute(statement.query, params)
        return cur.rowcount


def dumps(value: Any) -> str:
    """JSON text for a ``jsonb`` parameter.

    Raises:
        InvalidInputError: The value is not JSON-serializable.
    """
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError("a payload is not JSON-serializable") from exc


def when(value: dt.datetime | None) -> str | None:
    """An ISO timestamp for a JSON-carried parameter.

    Raises:
        InvalidInputError: The datetime is naive (its time zone would be a guess).
    """
    if value is None:
        return None
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError("timestamps must be timezone-aware")
    return value.isoformat()


def utc(value: dt.datetime) -> dt.datetime:
    """A database timestamp in UTC."""
    return value.astimezone(dt.UTC)
