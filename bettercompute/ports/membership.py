"""Worker membership rows: who is alive in each role."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from typing import Protocol

import attrs

__all__ = ["Member", "Membership"]


@attrs.frozen(kw_only=True)
class Member:
    """A live worker process in one role: ``id`` is unique per process (it is the holder of its shard leases)."""

    role: str
    id: str
    instance: str
    started_at: dt.datetime
    heartbeat_at: dt.datetime
    expires_at: dt.datetime


class Membership(Protocol):
    """Worker membership: one row per ``(role, id)``, live until it expires, refreshed by heartbeats."""

    async def heartbeat(self, *, roles: Collection[str], id: str, instance: str, ttl: dt.timedelta) -> list[Member]:
        """Register (or refresh) ``id`` in each role, live for ``ttl``; returns the live members of those roles,
        this one included, ordered by role and id. Idempotent; also forgets members long expired."""
        ...

    async def leave(self, *, roles: Collection[str], id: str) -> None:
        """Remove ``id``'s rows, so the others rebalance at once. Idempotent."""
        ...

    async def live(self, role: str) -> list[Member]:
        """The unexpired members of ``role``, ordered by id."""
        ...
