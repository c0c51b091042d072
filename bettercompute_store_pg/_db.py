"""The store's one way to the database: a pool of psycopg 3 connections, and statements run on them directly.

Every statement, in a transaction or on its own, is sent by psycopg's ``AsyncConnection``. Pooled connections stay
in autocommit: a statement on its own is one round trip (no BEGIN, no COMMIT). A transaction is an explicit
``BEGIN`` ... ``COMMIT`` on one checked-out connection (``Database.transaction``), and it spends as few round trips
as its statements allow: BEGIN is not sent alone but with the transaction's first statement, and a write whose rows
no one reads (``defer_in``: audit rows, projections, outbox events, work items) waits to be sent with the next
statement, or with the COMMIT, in one psycopg pipeline. The server sees the same statements in the same order; only
the error of a deferred write surfaces at the statement it was sent with.

The pool is the store's own (``_pool``, where the choice is explained); SQLAlchemy only parses the URL.

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
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import anyio
import attrs
import psycopg
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.rows import RowMaker
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from bettercompute.errors import InternalError, InvalidConfigError, InvalidInputError

from ._errors import translated
from ._pool import ConnectionPool, PgConnection, pipelined
from ._schema import quote_schema

__all__ = [
    "CHECKOUT_TIMEOUT_SECONDS",
    "CONNECT_TIMEOUT_SECONDS",
    "Connection",
    "Database",
    "PoolUsage",
    "Statement",
    "defer_in",
    "driver_url",
    "dumps",
    "fetch_in",
    "named_row",
    "rowcount_in",
    "utc",
    "when",
]

Connection = PgConnection
"""A pooled connection, a psycopg ``AsyncConnection`` (in autocommit; its rows are tuples unless a cursor says
otherwise)."""

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
    """How the pool is used: checkouts so far, connections held now, the most held at once since ``reset_peak()``,
    and round trips to the server made by connections already given back (a pipeline of several statements is one).
    Every database access of the store, by any path, is one checkout."""

    checkouts: int = 0
    in_use: int = 0
    peak: int = 0
    round_trips: int = 0

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


@attrs.define
class Database:
    """The store's pool (``None`` until ``open``), its schema, and the ways to run statements on it."""

    schema: str
    pool: ConnectionPool | None = None
    usage: PoolUsage = attrs.field(factory=PoolUsage)

    def sql(self, template: str) -> Statement:
        """A statement with ``{s}`` replaced by the quoted schema; build it once and reuse it."""
        return Statement.of(template.replace("{s}", quote_schema(self.schema)))

    def open(self, url: URL, *, pool_size: int, prepared_statements: bool) -> None:
        """Create the pool (no connection yet: each is made by the first call that needs it). Idempotent."""
        if self.pool is not None:
            return
        connect_args: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
        if not prepared_statements:
            connect_args["prepare_threshold"] = None
        self.pool = ConnectionPool(
            conninfo(url), size=pool_size, checkout_timeout=CHECKOUT_TIMEOUT_SECONDS, **connect_args
        )

    async def close(self) -> None:
        """Close every pooled connection. Idempotent."""
        pool, self.pool = self.pool, None
        if pool is not None:
            await pool.close()

    def require(self) -> ConnectionPool:
        """The pool.

        Raises:
            InternalError: ``open()`` was not called (a programming error).
        """
        if self.pool is None:
            raise InternalError("the store is not open")
        return self.pool

    async def _checkout(self) -> tuple[ConnectionPool, Connection]:
        """A pooled connection (and its pool), counted in ``usage``; give it back with ``_checkin``."""
        pool = self.require()
        pool.checkout_timeout = CHECKOUT_TIMEOUT_SECONDS  # read each time: tests shorten it
        conn = await pool.get()
        conn.round_trips = 0
        usage = self.usage
        usage.checkouts += 1
        usage.in_use += 1
        usage.peak = max(usage.peak, usage.in_use)
        return pool, conn

    async def _checkin(self, pool: ConnectionPool, conn: Connection) -> None:
        """Return ``conn`` if it is idle; drop it otherwise (left in a transaction, mid-statement, or broken)."""
        self.usage.in_use -= 1
        self.usage.round_trips += conn.round_trips
        if not pool.put(conn):
            await pool.drop(conn)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """A pooled connection, in autocommit, for the block; it goes back to the pool only when idle.

        A connection left in a transaction or mid-statement (the block was cancelled, or the server went away) is
        dropped instead, so the pool never hands out a dirty one.
        """
        pool, conn = await self._checkout()
        try:
            yield conn
        finally:
            await self._checkin(pool, conn)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """``BEGIN`` on a pooled connection; ``COMMIT`` when the block ends, ``ROLLBACK`` if it raises.

        BEGIN waits to be sent with the block's first statement, and deferred writes with the next statement or
        the COMMIT (see the module docstring): a block that sends nothing costs no round trip.

        Raises:
            UnavailableError: The database cannot be reached, or asked for the transaction to be retried.
            ConflictError, InternalError: As ``translated`` maps the driver's errors.
        """
        async with self.connection() as conn:
            conn.pending.append(_BEGIN)
            try:
                yield conn
            except BaseException:
                await _rollback(conn)
                raise
            if conn.pending == [_BEGIN]:
                conn.pending.clear()  # nothing was sent: there is nothing to commit
                return
            await _send(conn, _COMMIT)

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
        pool, conn = await self._checkout()
        conn.round_trips += 1
        try:
            with translated():
                cur = conn.cursor(row_factory=named_row)
                await cur.execute(statement.query, params)
                return await _rows(cur), cur.rowcount
        finally:
            await self._checkin(pool, conn)


_BEGIN: tuple[str, Any] = ("BEGIN", None)
_COMMIT: tuple[str, Any] = ("COMMIT", None)


def conninfo(url: URL) -> str:
    """The libpq URI of a driver URL (``driver_url``), password included."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


async def _rows(cur: psycopg.AsyncCursor[Any]) -> list[Any]:
    """The rows of the statement ``cur`` ran, or none if it returns none (an UPDATE without RETURNING).

    Asks the result's status, not ``cur.description``, which would build a column object per column each time.
    """
    result = cur.pgresult
    if result is None or result.status != ExecStatus.TUPLES_OK:
        return []
    return await cur.fetchall()


async def _send(conn: Connection, last: tuple[str, Any]) -> psycopg.AsyncCursor[Any]:
    """Send the connection's pending statements and then ``last`` in one pipeline (one round trip); ``last``'s
    cursor, its result read. The first error of any of them is raised (translated)."""
    pending, conn.pending = conn.pending, []
    query, params = last
    prepare = False if params is None else None
    conn.round_trips += 1
    with translated():
        cur: psycopg.AsyncCursor[Any] = conn.cursor(row_factory=named_row)
        if not pending:
            await cur.execute(query, params, prepare=prepare)
            return cur
        async with pipelined(conn):
            for held, held_params in pending:
                await conn.cursor().execute(held, held_params, prepare=False if held_params is None else None)
            await cur.execute(query, params, prepare=prepare)
        return cur


async def _rollback(conn: Connection) -> None:
    """End a failed or cancelled block's transaction, shielded from the cancellation and bounded in time.

    A transaction whose BEGIN was never sent has nothing to roll back: its pending statements are dropped. A
    connection mid-statement (cancelled while waiting for its result) is left as it is: the pool drops it, and the
    server rolls back when the connection closes.
    """
    if conn.pending and conn.pending[0] is _BEGIN:
        conn.pending.clear()
        return
    conn.pending.clear()
    if conn.broken or conn.info.transaction_status not in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        return
    with anyio.move_on_after(ROLLBACK_TIMEOUT_SECONDS, shield=True), contextlib.suppress(psycopg.Error):
        await conn.execute("ROLLBACK", prepare=False)  # counted by ``execute``


async def fetch_in(conn: Connection, statement: Statement, params: Mapping[str, Any]) -> list[Any]:
    """Run one statement on a connection whose transaction the caller owns (sending what waits before it, in the
    same round trip); its rows, columns as attributes."""
    cur = await _send(conn, (statement.query, params))
    return await _rows(cur)


def defer_in(conn: Connection, statement: Statement, params: Mapping[str, Any]) -> None:
    """Queue a write whose rows no one reads, to be sent with the transaction's next statement or its COMMIT.

    Its error, if any, surfaces there: the transaction then rolls back as for any failed statement. Outside a
    transaction there is nothing to wait for, so use ``fetch_in``.

    Raises:
        InternalError: ``conn`` is not in a transaction of ``Database.transaction`` (a programming error).
    """
    if not conn.pending and conn.info.transaction_status != TransactionStatus.INTRANS:
        raise InternalError("a deferred write needs a transaction")
    conn.pending.append((statement.query, params))


async def rowcount_in(conn: Connection, statement: Statement, params: Mapping[str, Any]) -> int:
    """Run one statement on a connection whose transaction the caller owns (sending what waits before it, in the
    same round trip); how many rows it changed."""
    cur = await _send(conn, (statement.query, params))
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
