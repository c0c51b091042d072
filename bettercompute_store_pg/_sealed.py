"""``sealed_column``: the PostgreSQL adapter of a ``Sealed`` column (KMS blobs a re-wrap walks), for any table whose
primary key is a text ``id``."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from bettercompute.ports import SealedBlob

from ._db import Database
from ._repository import PgRepository

__all__ = ["PgSealed", "sealed_column"]

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class PgSealed(PgRepository):
    """The blobs of ``table.column`` by ``id``; ``context`` makes each one's KMS context from its row (``id`` and
    the ``fields`` named)."""

    def __init__(
        self,
        db: Database,
        *,
        table: str,
        column: str,
        fields: Sequence[str],
        context: Callable[[Any], str],
    ) -> None:
        super().__init__(db)
        for name in (table, column, *fields):
            if not _IDENTIFIER.fullmatch(name):
                raise ValueError(f"not a plain identifier: {name!r}")
        selected = ", ".join(["id", f"{column} AS blob", *fields])
        self._page = db.sql(
            f"SELECT {selected} FROM {{s}}.{table} WHERE {column} IS NOT NULL"
            " AND (CAST(:after AS text) IS NULL OR id > :after) ORDER BY id LIMIT :limit"
        )
        self._reseal = db.sql(f"UPDATE {{s}}.{table} SET {column} = :new WHERE id = :id AND {column} = :old")
        self._context = context

    async def sealed(self, *, after: str | None, limit: int) -> list[SealedBlob]:
        rows = await self._fetch(self._page, {"after": after, "limit": limit})
        return [SealedBlob(key=r.id, context=self._context(r), blob=bytes(r.blob)) for r in rows]

    async def reseal(self, key: str, *, old: bytes, new: bytes) -> bool:
        return await self._rowcount(self._reseal, {"id": key, "old": old, "new": new}) == 1


def sealed_column(
    table: str, column: str, context: Callable[[Any], str], *, fields: Sequence[str] = ()
) -> Callable[[Database], PgRepository]:
    """The adapter factory of one sealed column, for a module's ``REPOSITORIES``."""

    def make(db: Database) -> PgRepository:
        return PgSealed(db, table=table, column=column, fields=fields, context=context)

    return make
