"""What the repositories share: the engine, once open, and a one-statement runner.

A single statement outside a caller's transaction (``Database.fetch``, ``Database.rowcount``) runs on the pooled
connection's psycopg connection directly, in autocommit: SQLAlchemy's ``Connection``, compilation and result layers
cost more Python time than the round trip itself (``bench/claims.py``). Statements inside a caller's transaction
(``fetch_in``) keep going through SQLAlchemy. Either way the statement text is fixed per ``Statement``, so psycopg's
automatic prepare (off with ``prepared_statements=False``) sees the same query every time.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import namedtuple_row
from sqlalchemy import Row, TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.util import greenlet_spawn

from bettercompute.errors import InternalError, InvalidInputError

from ._errors import translated
from ._schema import quote_schema

__all__ = ["Database", "Statement", "dumps", "fetch_in", "utc", "when"]

# ``:name`` (not ``::type``) becomes psycopg's ``%(name)s``; a literal ``%`` is doubled.
_BIND = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")  # the pattern text() itself uses


@attrs.frozen(eq=False)
class Statement:
    """One SQL statement, as SQLAlchemy ``text()`` (in a caller's transaction) and as psycopg query text."""

    clause: TextClause
    query: str

    @classmethod
    def of(cls, sql: str) -> Statement:
        """``sql`` with ``:name`` parameters."""
        return cls(text(sql), _BIND.sub(r"%(\1)s", sql.replace("%", "%%")))


@attrs.define
class Database:
    """The store's engine (``None`` until ``open``) and its schema."""

    schema: str
    engine: AsyncEngine | None = None

    def sql(self, template: str) -> Statement:
        """A statement with ``{s}`` replaced by the quoted schema; build it once and reuse it."""
        return Statement.of(template.replace("{s}", quote_schema(self.schema)))

    def attach(self, engine: AsyncEngine | None) -> None:
        """Use ``engine`` (or none, once closed)."""
        self.engine = engine

    def require(self) -> AsyncEngine:
        """The engine.

        Raises:
            InternalError: ``open()`` was not called (a programming error).
        """
        if self.engine is None:
            raise InternalError("the store is not open")
        return self.engine

    async def fetch(self, statement: Statement, params: Mapping[str, Any]) -> list[Any]:
        """Run one statement in its own (autocommit) transaction; its rows, with the columns as attributes."""
        rows, _ = await self._run(statement, params)
        return rows

    async def rowcount(self, statement: Statement, params: Mapping[str, Any]) -> int:
        """Run one statement in its own (autocommit) transaction and return how many rows it changed."""
        _, count = await self._run(statement, params)
        return count

    async def _run(self, statement: Statement, params: Mapping[str, Any]) -> tuple[list[Any], int]:
        """One round trip on a pooled connection's psycopg connection, in autocommit (no BEGIN, no COMMIT).

        The connection goes back to the pool as SQLAlchemy left it (autocommit off), or is invalidated when it is
        not idle any more (broken, or the call was cancelled mid-statement).
        """
        engine = self.require()
        with translated():
            fairy = await engine.raw_connection()
            try:
                conn = fairy.driver_connection
                assert isinstance(conn, psycopg.AsyncConnection)
                await conn.set_autocommit(True)
                try:
                    async with conn.cursor(row_factory=namedtuple_row) as cur:
                        await cur.execute(statement.query, params)
                        rows = await cur.fetchall() if cur.description is not None else []
                        return rows, cur.rowcount
                finally:
                    if not conn.broken and conn.info.transaction_status == TransactionStatus.IDLE:
                        await conn.set_autocommit(False)
            finally:
                await _release(fairy)


async def _release(fairy: PoolProxiedConnection) -> None:
    """Return ``fairy`` to the pool, or drop it if its connection is not reusable as is."""
    conn = fairy.driver_connection
    usable = (
        isinstance(conn, psycopg.AsyncConnection)
        and not conn.broken
        and not conn.autocommit
        and conn.info.transaction_status == TransactionStatus.IDLE
    )
    if not usable:
        await greenlet_spawn(fairy.invalidate)
    await greenlet_spawn(fairy.close)


async def fetch_in(conn: AsyncConnection, statement: Statement, params: Mapping[str, Any]) -> Sequence[Row[Any]]:
    """Run one statement on a connection whose transaction the caller owns."""
    with translated():
        result = await conn.execute(statement.clause, dict(params))
        return result.all() if result.returns_rows else []


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
