"""One-time nonces: a replay guard."""

from __future__ import annotations

import datetime as dt
from typing import Protocol

__all__ = ["ReplayGuard"]


class ReplayGuard(Protocol):
    """Remembers nonces so that a sealed message is accepted once (``Unsealer``). Implementations: the PostgreSQL
    store's ``nonces`` (shared by every process) and ``bettercompute.testing.InMemoryReplayGuard`` (tests only)."""

    async def first_use(self, scope: str, nonce: bytes, *, expires_at: dt.datetime, now: dt.datetime) -> bool:
        """Record ``nonce`` in ``scope`` until ``expires_at``; ``True`` the first time, ``False`` while it is still
        remembered (a nonce whose record expired by ``now`` counts as new). Atomic across concurrent callers."""
        ...

    async def purge(self, *, now: dt.datetime, limit: int = 10_000) -> int:
        """Forget up to ``limit`` nonces expired by ``now``; returns how many."""
        ...
