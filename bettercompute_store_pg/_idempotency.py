"""Idempotency keys: ``begin`` is one upsert that always returns the row, so concurrent callers agree."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any

from bettercompute.ports import IdempotencyOutcome

from ._db import Database, dumps

__all__ = ["KEY_UPSERT", "PgIdempotencyKeys"]

# The conflict branch always updates (to the same values unless the row expired) so RETURNING yields the row even
# when another transaction inserted it after this statement's snapshot; ``attempt`` tells whether this call won.
# A key's row, taken over only when it expired (shared with admission's transaction 1, which reserves its key in
# the same statement as its draft).
KEY_UPSERT = """
ON CONFLICT (identity, key) DO UPDATE SET
    request_hash = CASE WHEN k.expires_at <= now() THEN EXCLUDED.request_hash ELSE k.request_hash END,
    state = CASE WHEN k.expires_at <= now() THEN 'in_progress' ELSE k.state END,
    result = CASE WHEN k.expires_at <= now() THEN NULL ELSE k.result END,
    attempt = CASE WHEN k.expires_at <= now() THEN EXCLUDED.attempt ELSE k.attempt END,
    created_at = CASE WHEN k.expires_at <= now() THEN now() ELSE k.created_at END,
    expires_at = CASE WHEN k.expires_at <= now() THEN EXCLUDED.expires_at ELSE k.expires_at END
RETURNING k.attempt = :attempt AS won, k.request_hash, k.state, k.result
"""

_BEGIN = (
    """
INSERT INTO {s}.idempotency_keys AS k (identity, key, request_hash, state, attempt, expires_at)
VALUES (:identity, :key, :request_hash, 'in_progress', :attempt, now() + :ttl)"""
    + KEY_UPSERT
)

_FINISH = """
UPDATE {s}.idempotency_keys SET state = 'done', result = CAST(:result AS jsonb)
WHERE identity = :identity AND key = :key
"""

_PURGE = """
DELETE FROM {s}.idempotency_keys WHERE (identity, key) IN (
    SELECT identity, key FROM {s}.idempotency_keys WHERE expires_at <= now() ORDER BY expires_at LIMIT :limit
)
"""

# A finished key keeps its stored result: only an unfinished reservation can be abandoned.
_ABANDON = "DELETE FROM {s}.idempotency_keys WHERE identity = :identity AND key = :key AND state = 'in_progress'"


class PgIdempotencyKeys:
    """``bettercompute.ports.IdempotencyKeys`` on the ``idempotency_keys`` table."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._begin = db.sql(_BEGIN)
        self._finish = db.sql(_FINISH)
        self._abandon = db.sql(_ABANDON)
        self._purge = db.sql(_PURGE)

    async def begin(self, *, identity: str, key: str, request_hash: str, ttl: dt.timedelta) -> IdempotencyOutcome:
        """Reserve ``key`` for this request, or report what an earlier use of it left."""
        params = {"identity": identity, "key": key, "request_hash": request_hash, "ttl": ttl}
        rows = await self._db.fetch(self._begin, {**params, "attempt": uuid.uuid4().hex})
        row = rows[0]
        if row.won:
            return IdempotencyOutcome(state="new")
        if row.request_hash != request_hash:
            return IdempotencyOutcome(state="conflict")
        if row.state == "done":
            return IdempotencyOutcome(state="replay", result=row.result)
        return IdempotencyOutcome(state="in_progress")

    async def finish(self, *, identity: str, key: str, result: Mapping[str, Any]) -> None:
        """Store the result later uses of the key replay."""
        await self._db.fetch(self._finish, {"identity": identity, "key": key, "result": dumps(dict(result))})

    async def abandon(self, *, identity: str, key: str) -> None:
        """Forget an unfinished reservation so the key may be used again."""
        await self._db.fetch(self._abandon, {"identity": identity, "key": key})

    async def purge(self, *, limit: int = 10_000) -> int:
        """Delete up to ``limit`` keys whose time is up (their answers are no longer replayed); how many went."""
        return await self._db.rowcount(self._purge, {"limit": limit})
