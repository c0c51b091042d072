"""``PgRepository``: what every PostgreSQL adapter of a repository shares, bound to a transaction or not.

An adapter is made once per store, with its statements (``db.sql(...)``) built in its constructor. Outside a
transaction (``store.repository(KEY)``) each call runs one statement on a pooled connection in autocommit.
``tx.repository(KEY)`` gives a copy bound to the transaction's connection (``bound``): a shallow copy, so it shares
the statements and costs one small object per transaction and key (the transaction keeps it for the next ask).
Methods that only make sense in a transaction (locks, ``FOR UPDATE``, writes that must commit or roll back with
others) run through ``_fetch_in_transaction``, which refuses an unbound call.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Self

from bettercompute.errors import InternalError

from ._db import Connection, Database, Statement, fetch_in, rowcount_in

__all__ = ["PgRepository"]


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
