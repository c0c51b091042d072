"""``PgRepository``: what every PostgreSQL adapter of a repository shares, bound to a transaction or not.

An adapter is made once per store, with its statements (``db.sql(...)``) built in its constructor. Outside a
transaction (``store.repository(KEY)``) each call runs one statement on a pooled connection in autocommit.
``tx.repository(KEY)`` gives a copy bound to the transaction's connection (``bound``): a shallow copy, so it shares
the statements and costs one small object per transaction and key (the transaction keeps it for the next ask).
Methods that only make sense in a transaction (locks, ``FOR UPDATE``, writes that must commit or roll back with
others) run through ``_fetch_in_transaction``, which refuses an unbound call.

``PartialUpdate`` is for the adapters whose records change a few fields at a time (``update_machine(id,
state=..., step=...)``): one ``UPDATE`` per set of fields a caller names, built on first use and kept.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Self

from bettercompute.errors import InternalError

from ._db import Connection, Database, Statement, fetch_in, rowcount_in

__all__ = ["PartialUpdate", "PgRepository", "Pokes", "PokingRepository"]

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class PgRepository:
    """The base of the PostgreSQL adapters of repositories (the store's and other packages').

    Subclasses take the store's ``Database`` (``__init__(self, db)``), build their statements with ``db.sql``, and
    run them with ``_fetch``, ``_rowcount`` or ``_fetch_in_transaction``; they never hold a connection themselves.
    """

    _connection: Connection | None = None
    """The transaction's connection in a bound copy; ``None`` in the store's own adapter."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def bound(self, connection: Connection) -> Self:
        """A copy of this adapter that runs every statement on ``connection`` (a transaction's), sharing the
        statements."""
        made = copy.copy(self)
        made._connection = connection
        return made

    async def _fetch(self, statement: Statement, params: Mapping[str, Any]) -> list[Any]:
        """The rows of one statement: in the bound transaction, else on its own in autocommit."""
        connection = self._connection
        if connection is None:
            return await self._db.fetch(statement, params)
        return await fetch_in(connection, statement, params)

    async def _rowcount(self, statement: Statement, params: Mapping[str, Any]) -> int:
        """How many rows one statement changed: in the bound transaction, else on its own in autocommit."""
        connection = self._connection
        if connection is None:
            return await self._db.rowcount(statement, params)
        return await rowcount_in(connection, statement, params)

    def _transaction(self, method: str) -> Connection:
        """The bound transaction's connection.

        Raises:
            InternalError: this adapter is not bound to a transaction (a programming error: ``method`` was called
                on ``store.repository(...)``).
        """
        connection = self._connection
        if connection is None:
            raise InternalError(f"{type(self).__name__}.{method} needs a transaction: use tx.repository(...)")
        return connection

    async def _fetch_in_transaction(self, method: str, statement: Statement, params: Mapping[str, Any]) -> list[Any]:
        """The rows of one statement run in the bound transaction; ``InternalError`` when unbound (see
        ``_transaction``)."""
        return await fetch_in(self._transaction(method), statement, params)


class PartialUpdate:
    """``UPDATE <table> SET a = :a, b = :b, ... WHERE <key> = :<key> RETURNING ...`` for whichever of the declared
    columns a call sets: one statement per set of names, built on its first use and kept (the adapter and its bound
    copies share them).

    Each declared column has the type its parameter is cast to, or ``None`` to take the value as it is. A ``jsonb``
    (or ``json``) column's value is sent as JSON text, an array column's (``text[]``, ``integer[]``) as a list;
    ``None`` is ``NULL`` for either.

    Args:
        db: The store's database (what the adapter was made with).
        table: The table, in the store's schema.
        columns: Every column a call may set, with its cast.
        returning: The select list the statement returns (the record's columns).
        key: The column naming the row; its parameter has its name.
        touch: A column every update also sets to ``now()`` (``None``: none).

    Raises:
        ValueError: a name is not a plain lowercase SQL identifier, or the key or ``touch`` is declared as a column.
    """

    def __init__(
        self,
        db: Database,
        table: str,
        columns: Mapping[str, str | None],
        *,
        returning: str,
        key: str = "id",
        touch: str | None = "updated_at",
    ) -> None:
        names = [table, key, *columns, *([touch] if touch is not None else [])]
        odd = sorted(n for n in names if not _IDENTIFIER.fullmatch(n))
        if odd:
            raise ValueError(f"not plain SQL identifiers: {odd}")
        if key in columns or (touch is not None and touch in columns):
            raise ValueError(f"{table}: the key and the touched column are not set by a caller")
        self._db = db
        self._table = table
        self._columns = dict(columns)
        self._returning = returning
        self._key = key
        self._touch = touch
        self._statements: dict[frozenset[str], Statement] = {}

    def statement(self, names: Iterable[str]) -> Statement:
        """The statement setting ``names`` (built once per set of names).

        Raises:
            ValueError: a name is not a declared column, or there is nothing to set.
        """
        wanted = frozenset(names)
        made = self._statements.get(wanted)
        if made is not None:
            return made
        unknown = sorted(wanted - self._columns.keys())
        if unknown:
            raise ValueError(f"not a column of {self._table} a caller may set: {unknown}")
        sets = [self._assignment(name) for name in sorted(wanted)]
        if self._touch is not None:
            sets.append(f"{self._touch} = now()")
        if not sets:
            raise ValueError(f"an update of {self._table} needs a column to set")
        made = self._db.sql(
            f"UPDATE {{s}}.{self._table} SET {', '.join(sets)} WHERE {self._key} = :{self._key}"
            f" RETURNING {self._returning}"
        )
        self._statements[wanted] = made
        return made

    def prepare(self, key: Any, fields: Mapping[str, Any]) -> tuple[Statement, dict[str, Any]]:
        """The statement setting ``fields`` on the row ``key`` names, and its parameters (values converted for
        their casts).

        Raises:
            ValueError: a field is not a declared column, or there is nothing to set.
        """
        statement = self.statement(fields)
        params: dict[str, Any] = {name: self._value(name, value) for name, value in fields.items()}
        params[self._key] = key
        return statement, params

    def _assignment(self, name: str) -> str:
        cast = self._columns[name]
        return f"{name} = :{name}" if cast is None else f"{name} = CAST(:{name} AS {cast})"

    def _value(self, name: str, value: Any) -> Any:
        cast = self._columns[name]
        if value is None or cast is None:
            return value
        if cast in ("jsonb", "json"):
            return json.dumps(value)
        if cast.endswith("[]"):
            return list(value)
        return value


Pokes = Callable[[frozenset[str], bool], Awaitable[None]]
"""What a store runs after a commit: the kinds of work enqueued, and whether events were published."""


class PokingRepository(PgRepository):
    """An adapter whose calls are each a transaction of their own that may enqueue work or publish events (a
    function of the store that does both): after each, it pokes the store's listeners, as a transaction's commit
    does (``PgStore`` hands it ``pokes``)."""

    _pokes: Pokes | None = None

    def poke_with(self, pokes: Pokes) -> None:
        """Run ``pokes`` after each call that enqueued or published."""
        self._pokes = pokes

    async def _poke(self, kinds: frozenset[str], published: bool) -> None:
        if self._pokes is not None and (kinds or published):
            await self._pokes(kinds, published)
