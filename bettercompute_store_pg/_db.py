"""What the repositories share: the engine, once open, and a one-statement runner."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from sqlalchemy import Row, TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from bettercompute.errors import InternalError, InvalidInputError

from ._errors import translated
from ._schema import quote_schema

__all__ = ["Database", "dumps", "fetch_in", "utc", "when"]


@attrs.define
class Database:
    """The store's engine (``None`` until ``open``) and its schema."""

    schema: str
    engine: AsyncEngine | None = None
    _autocommit: AsyncEngine | None = None

    def sql(self, template: str) -> TextClause:
        """A statement with ``{s}`` replaced by the quoted schema; build it once and reuse it (compiled once)."""
        return text(template.replace("{s}", quote_schema(self.schema)))

    def attach(self, engine: AsyncEngine | None) -> None:
        """Use ``engine`` (or none, once closed)."""
        self.engine = engine
        # Single statements run in autocommit: one round trip instead of BEGIN, statement, COMMIT.
        self._autocommit = None if engine is None else engine.execution_options(isolation_level="AUTOCOMMIT")

    def require(self) -> AsyncEngine:
        """The engine.

        Raises:
            InternalError: ``open()`` was not called (a programming error).
        """
        if self.engine is None:
            raise InternalError("the store is not open")
        return self.engine

    async def fetch(self, statement: TextClause, params: Mapping[str, Any]) -> Sequence[Row[Any]]:
        """Run one statement in its own (autocommit) transaction and return its rows."""
        self.require()
        assert self._autocommit is not None
        with translated():
            async with self._autocommit.connect() as conn:
                result = await conn.execute(statement, dict(params))
                return result.all() if result.returns_rows else []

    async def rowcount(self, statement: TextClause, params: Mapping[str, Any]) -> int:
        """Run one statement in its own (autocommit) transaction and return how many rows it changed."""
        self.require()
        assert self._autocommit is not None
        with translated():
            async with self._autocommit.connect() as conn:
                result = await conn.execute(statement, dict(params))
                return int(result.rowcount)


async def fetch_in(conn: AsyncConnection, statement: TextClause, params: Mapping[str, Any]) -> Sequence[Row[Any]]:
    """Run one statement on a connection whose transaction the caller owns."""
    with translated():
        result = await conn.execute(statement, dict(params))
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
