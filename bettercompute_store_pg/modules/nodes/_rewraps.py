"""``Rewraps`` on ``kms_rewraps``: the re-wraps of the KMS blobs and how far each has gone."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from bettercompute.modules.nodes import RewrapRecord
from bettercompute_store_pg._db import Database, utc
from bettercompute_store_pg._repository import PgRepository

__all__ = ["PgRewraps"]

_COLUMNS = "id, state, columns, position, after, resealed, failed, failures, created_by, created_at, finished_at"
_MAX_FAILURES = 20

_START = f"""
INSERT INTO {{s}}.kms_rewraps (id, state, columns, created_by) VALUES (:id, 'running', :columns, :created_by)
ON CONFLICT DO NOTHING
RETURNING {_COLUMNS}
"""
_GET = f"SELECT {_COLUMNS} FROM {{s}}.kms_rewraps WHERE id = :id"
_RUNNING = f"SELECT {_COLUMNS} FROM {{s}}.kms_rewraps WHERE state = 'running'"
_ADVANCE = f"""
UPDATE {{s}}.kms_rewraps SET position = :position, after = :after,
    resealed = resealed + :resealed, failed = failed + :failed,
    failures = (
        SELECT coalesce(jsonb_agg(f ORDER BY n), '[]'::jsonb)
        FROM jsonb_array_elements(failures || CAST(:failures AS jsonb)) WITH ORDINALITY AS e (f, n)
        WHERE n <= {_MAX_FAILURES}
    ),
    state = CASE WHEN :done THEN 'done' ELSE state END,
    finished_at = CASE WHEN :done THEN now() ELSE finished_at END
WHERE id = :id AND state = 'running'
RETURNING {_COLUMNS}
"""


def _rewrap(row: Any) -> RewrapRecord:
    return RewrapRecord(
        id=row.id,
        state=row.state,
        columns=tuple(row.columns),
        position=row.position,
        after=row.after,
        resealed=row.resealed,
        failed=row.failed,
        failures=tuple(row.failures),
        created_by=row.created_by,
        created_at=utc(row.created_at),
        finished_at=utc(row.finished_at) if row.finished_at is not None else None,
    )


class PgRewraps(PgRepository):
    """``Rewraps`` on ``kms_rewraps`` (one running at a time: a partial unique index)."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._start = db.sql(_START)
        self._get = db.sql(_GET)
        self._running = db.sql(_RUNNING)
        self._advance = db.sql(_ADVANCE)

    async def start(self, *, id: str, columns: Sequence[str], created_by: str | None) -> RewrapRecord | None:
        rows = await self._fetch(self._start, {"id": id, "columns": list(columns), "created_by": created_by})
        return _rewrap(rows[0]) if rows else None

    async def get(self, id: str) -> RewrapRecord | None:
        rows = await self._fetch(self._get, {"id": id})
        return _rewrap(rows[0]) if rows else None

    async def running(self) -> RewrapRecord | None:
        rows = await self._fetch(self._running, {})
        return _rewrap(rows[0]) if rows else None

    async def advance(
        self,
        id: str,
        *,
        position: int,
        after: str | None,
        resealed: int,
        failed: int,
        failures: Sequence[Mapping[str, str]],
        done: bool,
    ) -> RewrapRecord | None:
        params = {
            "id": id,
            "position": position,
            "after": after,
            "resealed": resealed,
            "failed": failed,
            "failures": json.dumps([dict(f) for f in failures]),
            "done": done,
        }
        rows = await self._fetch(self._advance, params)
        return _rewrap(rows[0]) if rows else None
