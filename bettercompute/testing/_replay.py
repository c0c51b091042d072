"""``InMemoryReplayGuard``: the ``ReplayGuard`` port in a dict, for tests of one process only."""

from __future__ import annotations

import datetime as dt

import anyio

__all__ = ["InMemoryReplayGuard"]


class InMemoryReplayGuard:
    """Remembers nonces in this process only: for tests. Production uses the store's ``nonces`` (shared)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, bytes], dt.datetime] = {}
        self._lock = anyio.Lock()

    async def first_use(self, scope: str, nonce: bytes, *, expires_at: dt.datetime, now: dt.datetime) -> bool:
        """``True`` the first time ``(scope, nonce)`` is offered while unexpired."""
        async with self._lock:
            known = self.seen.get((scope, nonce))
            if known is not None and known > now:
                return False
            self.seen[(scope, nonce)] = expires_at
            return True

    async def purge(self, *, now: dt.datetime, limit: int = 10_000) -> int:
        """Forget up to ``limit`` expired nonces."""
        async with self._lock:
            expired = [key for key, at in self.seen.items() if at <= now][:limit]
            for key in expired:
                del self.seen[key]
            return len(expired)
