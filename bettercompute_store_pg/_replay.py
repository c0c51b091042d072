"""Nonces seen by ``bettercompute.Unsealer`` (``bettercompute.ports.ReplayGuard``) in ``replay_nonces``.

``first_use`` is one statement: an insert that, on conflict, only takes over a row whose record has expired, so of
two processes unsealing the same payload at once exactly one gets ``True``.
"""

from __future__ import annotations

import datetime as dt

from ._db import Database

__all__ = ["PgReplayGuard"]

_FIRST_USE = """
INSERT INTO {s}.replay_nonces AS r (scope, nonce, expires_at) VALUES (:scope, :nonce, :expires_at)
ON CONFLICT (scope, nonce) DO UPDATE SET expires_at = EXCLUDED.expires_at WHERE r.expires_at <= :now
RETURNING 1 AS first
"""

_PURGE = """
DELETE FROM {s}.replay_nonces WHERE ctid IN (
    SELECT ctid FROM {s}.replay_nonces WHERE expires_at <= :now ORDER BY expires_at LIMIT :limit
)
"""


class PgReplayGuard:
    """``ReplayGuard`` on the store's ``replay_nonces`` table (core migration 8), shared by every process."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._first_use = db.sql(_FIRST_USE)
        self._purge = db.sql(_PURGE)

    async def first_use(self, scope: str, nonce: bytes, *, expires_at: dt.datetime, now: dt.datetime) -> bool:
        """Record ``nonce`` in ``scope``; ``True`` unless it is recorded and unexpired at ``now``."""
        params = {"scope": scope, "nonce": nonce, "expires_at": expires_at, "now": now}
        return bool(await self._db.fetch(self._first_use, params))

    async def purge(self, *, now: dt.datetime, limit: int = 10_000) -> int:
        """Delete up to ``limit`` records expired by ``now``."""
        return await self._db.rowcount(self._purge, {"now": now, "limit": limit})
