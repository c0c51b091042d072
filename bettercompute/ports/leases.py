"""Exclusive, expiring leases with fencing tokens."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from typing import Protocol

import attrs

__all__ = ["Lease", "Leases"]


@attrs.frozen(kw_only=True)
class Lease:
    """A named, time-limited, exclusive right to do some work.

    ``token`` is the fencing token: it grows every time the lease changes hands, so a write carrying an older token
    can be recognised and refused after the lease has moved on.
    """

    name: str
    holder: str
    token: int
    expires_at: dt.datetime


class Leases(Protocol):
    """Exclusive, expiring leases with fencing tokens."""

    async def acquire(self, name: str, holder: str, ttl: dt.timedelta) -> Lease | None:
        """Take the lease if it is free, expired, or already ``holder``'s (then it is extended, same token).

        Returns ``None`` when another holder has it. Taking it from a different (or expired) holder increases the
        token. Safe to retry.
        """
        ...

    async def renew(self, lease: Lease, ttl: dt.timedelta) -> Lease | None:
        """Extend a lease still held with this token; ``None`` when it was lost (expired and taken, or released)."""
        ...

    async def release(self, lease: Lease) -> bool:
        """Give the lease back so another holder can take it at once. ``False`` when it was no longer held."""
        ...

    async def get(self, name: str) -> Lease | None:
        """The lease's current, unexpired state, or ``None``."""
        ...

    async def acquire_many(self, names: Collection[str], holder: str, ttl: dt.timedelta) -> list[Lease]:
        """``acquire`` for many leases in one call: the leases obtained (or extended), by name; safe to retry."""
        ...

    async def renew_many(self, leases: Collection[Lease], ttl: dt.timedelta) -> list[Lease]:
        """``renew`` for many leases in one call: those still held, extended; the others were lost."""
        ...

    async def release_many(self, leases: Collection[Lease]) -> int:
        """``release`` for many leases in one call; returns how many were still held."""
        ...
